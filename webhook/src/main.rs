// Feature `mimalloc` (default), configured at compile time in .cargo/config.toml:
// see webhook/Cargo.toml and docs/benchmarks.md.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(graceguard_webhook::cli::main());
}
