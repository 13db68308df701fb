//! `attn`: compute attention on the best backend here, and say how fast and how accurate it was.

mod bench;
mod cli;
mod report;
mod verify;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    if let Err(e) = cli.run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
