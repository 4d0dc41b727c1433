fn main() {
    std::process::exit(graceguard_webhook::cli::main());
}
