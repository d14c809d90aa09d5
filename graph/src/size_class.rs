//! The buffer pool's size classes: how much a request for `n` bytes really allocates, so that freed
//! buffers can serve later requests of nearby sizes without a device allocation.

/// Requests up to this size round to a power of two; larger ones to an eighth of their power of two.
const POWER_OF_TWO_UP_TO: u64 = 1 << 20;

/// The size a pooled buffer of at least `bytes` is allocated with. Small buffers round to a power of
/// two (few classes, high reuse); from 1 MiB up a class is an eighth of the enclosing power of two, so
/// a 12 GiB tensor takes 12 GiB and not 16: at most 12.5% is wasted where a waste costs the most.
pub fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(256);
    if bytes <= POWER_OF_TWO_UP_TO {
        return bytes.next_power_of_two();
    }
    let step = (1u64 << (63 - bytes.leading_zeros())) / 8;
    bytes.div_ceil(step).saturating_mul(step)
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn small_requests_round_to_powers_of_two() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
    }

    #[test]
    fn large_requests_waste_at_most_an_eighth() {
        assert_eq!(size_class(12 << 30), 12 << 30);
        assert_eq!(size_class((12 << 30) + 1), 13 << 30);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 17));
        for bytes in [(1u64 << 20) + 1, 3 << 29, (5 << 30) + 7, u64::MAX / 2] {
            let c = size_class(bytes);
            assert!(c >= bytes && c - bytes <= bytes / 8, "{bytes} -> {c}");
        }
        // Requests of nearby sizes share a class, so a freed buffer serves the next one.
        assert_eq!(size_class(10_000_000), size_class(10_400_000));
    }
}
