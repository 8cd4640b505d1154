//! Domain patterns and the compiled route matcher (in progress).
