//! Fuzzes what graceguard does with an admission review body: the parser and
//! every pure decision after it (see `graceguard_webhook::offline`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Two clocks: now, and one past any grace period in the input.
    let _ = graceguard_webhook::offline::process(data, 1_700_000_000);
    let _ = graceguard_webhook::offline::process(data, 253_402_300_799);
});
