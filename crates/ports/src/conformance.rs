//! The adapter conformance suite (feature `conformance`): async checks every adapter runs unchanged against a real database.
