//! streamweave facade.
