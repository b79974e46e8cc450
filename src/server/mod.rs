//! The server: listening and draining (`serve`), the routes, and the pass-through of paths
//! condenser does not compact. The top of the house; nothing below imports it.

pub mod admin;
pub mod admission;
pub mod allocator;
pub mod clean_path;
pub mod passthrough;
pub mod routes;
pub mod serve;
