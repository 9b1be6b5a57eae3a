//! Writers of a [`Report`](crate::schema::Report): terminal tables, Markdown, and a
//! self-contained HTML page with inline SVG plots.
//!
//! Sits between the report schema and files / the terminal. The tables are built once as cells
//! ([`tables`]) and written either way.

pub mod html;
pub mod svg;
pub mod tables;

pub use tables::{markdown, terminal};
