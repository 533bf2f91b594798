//! libFuzzer entry point; the checks are in `holdfast_fuzz::request_id`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| holdfast_fuzz::request_id::run(data));
