//! evb-net
