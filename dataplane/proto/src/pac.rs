//! PAC script generation (in progress).
