//! `ackd check` and `ackd status`: one-off commands for people and orchestrators. They
//! read the same settings as the daemon and talk to the same brokers, but never join
//! the group and never commit: they only ask (metadata, group description, committed
//! offsets, watermarks).

pub mod check;
pub mod connect;
pub mod describe;
pub mod status;
