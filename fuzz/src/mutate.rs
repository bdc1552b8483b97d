//! A small deterministic mutator for the stable driver (`tests/smoke.rs`): the classic
//! libFuzzer/AFL edits (bit flips, interesting integers, inserts, deletes, copies, splices with
//! another corpus entry) from a seeded xorshift generator, so a failing input is reproducible
//! from its seed alone. It has no coverage feedback; the libFuzzer driver does.

/// xorshift64*: tiny, seedable, good enough to pick edits.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Zero is xorshift's fixed point.
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "an empty range has no value");
        (self.next_u64() % n as u64) as usize
    }
}

/// Values that sit on the boundaries parsers get wrong.
const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Mutates `input` with 1 to 8 stacked edits; `other` is a second corpus entry to splice from.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8], len_max: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(8) {
        edit(rng, &mut out, other);
    }
    out.truncate(len_max);
    out
}

fn edit(rng: &mut Rng, out: &mut Vec<u8>, other: &[u8]) {
    if out.is_empty() {
        out.push(rng.next_u64() as u8);
        return;
    }
    let at = rng.below(out.len());
    match rng.below(9) {
        0 => out[at] ^= 1 << rng.below(8),
        1 => out[at] = rng.next_u64() as u8,
        2 => {
            // An interesting integer, 1, 2, 4 or 8 bytes wide, either byte order.
            let width = 1 << rng.below(4);
            let value = INTERESTING[rng.below(INTERESTING.len())];
            let bytes = if rng.below(2) == 0 {
                value.to_le_bytes()
            } else {
                value.to_be_bytes()
            };
            let bytes = if bytes[0] == 0 && width < 8 {
                &bytes[8 - width..]
            } else {
                &bytes[..width]
            };
            let end = (at + bytes.len()).min(out.len());
            out[at..end].copy_from_slice(&bytes[..end - at]);
        }
        3 => {
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            out.splice(at..at, bytes);
        }
        4 => {
            let n = 1 + rng.below((out.len() - at).min(64));
            out.drain(at..at + n);
        }
        5 => {
            // Copy a block of the input over another place in it.
            let from = rng.below(out.len());
            let n = 1 + rng.below((out.len() - from).min(64));
            let block = out[from..from + n].to_vec();
            out.splice(at..at, block);
        }
        6 => out.truncate(at),
        7 if !other.is_empty() => {
            // Splice: our head, the other entry's tail.
            let from = rng.below(other.len());
            out.truncate(at);
            out.extend_from_slice(&other[from..]);
        }
        _ => {
            let n = 1 + rng.below(8);
            out.splice(at..at, std::iter::repeat_n(out[at], n));
        }
    }
}
