// Feature `mimalloc` (default): see webhook/Cargo.toml and the README's benchmarks.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(graceguard_webhook::cli::main());
}
