//! libFuzzer entry point; the checks are in `holdfast_fuzz::selection`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| holdfast_fuzz::selection::run(data));
