//! MySQL read models of group messages: month tables ([`month`]), the month
//! catalog ([`catalog`]), the shard manager ([`shards`]) with its sealing
//! check ([`sealing`]) and month archives in object storage ([`archive`]),
//! the batched writer of the store pipeline ([`writer`]), Redis routes
//! ([`routes`]) and the consistency checker of routes, mirror and tables
//! ([`consistency`]).

pub mod archive;
pub mod catalog;
pub mod clock;
pub mod consistency;
pub mod dellog;
pub mod legacy;
pub mod marks;
pub mod message;
pub mod month;
pub mod revisions;
pub mod routes;
pub mod sealing;
pub mod setup;
pub mod shards;
pub mod writer;
