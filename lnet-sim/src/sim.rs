//! sim placeholder
