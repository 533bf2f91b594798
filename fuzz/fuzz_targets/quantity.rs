//! libFuzzer entry point; the checks are in `holdfast_fuzz::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| holdfast_fuzz::quantity::run(data));
