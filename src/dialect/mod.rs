//! One adapter per API that condenser compacts.

pub mod chat;
pub mod message_spans;
pub mod messages;
pub mod request;
pub mod responses;
pub mod stages;
