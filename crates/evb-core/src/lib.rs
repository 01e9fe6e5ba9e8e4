//! evb-core
