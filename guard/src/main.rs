fn main() {
    std::process::exit(graceguard::cli::main());
}
