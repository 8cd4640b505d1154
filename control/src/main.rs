//! The `switchyard` binary: all of it is the `switchyard-control` library (control/plane),
//! which release builds optimise for size; this crate stays at opt-level 3 because fat LTO
//! optimises the whole program, data plane included, at the level of the crate it links.
fn main() -> std::process::ExitCode {
    switchyard_control::main()
}
