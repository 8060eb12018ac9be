//! The `tiergate` binary. Thin: parse arguments, dispatch to a command (each sets up its logs; `serve` its traces too).

use clap::Parser;

mod cli;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args, std::env::vars()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
