//! HTTP: the server and its routes, the upstream client, and bodies.

pub mod body;
pub mod egress;
pub mod passthrough;
pub mod routes;
pub mod server;
pub mod upstream;
