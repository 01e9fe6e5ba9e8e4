//! `evb-fabric`: fat-tree topologies, routing engines, LFT import/export and
//! conflict analysis of shift schedules. (Being built: see issue 3.)
