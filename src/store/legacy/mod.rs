//! The legacy single table `im_group_messages` as the read and send paths
//! see it while a tenant migrates (seed 000 §9): its rows ([`table`]) and
//! the migration's state row — dual read on or off, the cutover
//! ([`state`]). The migration commands themselves are `crate::legacy`.

pub mod state;
pub mod table;
