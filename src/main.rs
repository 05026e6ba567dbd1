//! The `ackd` binary: the library with its built-in processors.

use std::process::ExitCode;

fn main() -> ExitCode {
    ackd::main_with(ackd::processors::Builtin::from_settings)
}
