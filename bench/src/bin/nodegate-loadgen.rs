use std::process::ExitCode;

fn main() -> anyhow::Result<ExitCode> {
    nodegate_bench::cli::main()
}
