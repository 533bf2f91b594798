//! The fuzz targets of holdfast, as plain functions from bytes to checks.
//!
//! Each `run(data)` must return normally for every input: a panic is a finding.
//! They are driven by libFuzzer (`fuzz_targets/`, through `cargo fuzz`) and by the
//! proptest fallback (`tests/fallback.rs`); `cargo xtask fuzz --seconds N` picks
//! whichever is available.

pub mod config;
pub mod quantity;
pub mod request_id;
pub mod selection;

/// A cursor over the fuzzer's bytes. Once they run out every read is 0, which the
/// targets treat as "the ordinary, fault-free answer", so every input terminates.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// The next byte, or 0 when the input is used up.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let wide = u64::from(u16::from_le_bytes([self.byte(), self.byte()]));
        wide % n
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability about `percent`%, never once the input is used up.
    pub fn fault(&mut self, percent: u8) -> bool {
        let b = self.byte();
        b != 0 && u32::from(b) * 100 < u32::from(percent) * 256
    }

    /// Eight bytes as a number (for seeding an RNG).
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }

    /// The rest of the input as text (invalid UTF-8 replaced).
    pub fn rest_text(&mut self) -> String {
        let text = String::from_utf8_lossy(self.data).into_owned();
        self.data = &[];
        text
    }
}
