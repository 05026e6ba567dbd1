//! The classic consumer protocol's member assignment, as DescribeGroups returns it:
//! `ConsumerProtocolAssignment` (versions 0-3, never flexible): int16 version, an int32
//! count of topics, each an int16-length string and an int32 count of int32 partitions,
//! then user data (ignored). Anything malformed is `None`, never a panic.

/// topic → partitions, in the order the bytes give them.
pub fn decode(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if version < 0 {
        return None;
    }
    let topics = r.count()?;
    let mut out = Vec::new();
    for _ in 0..topics {
        let len = usize::try_from(r.i16()?).ok()?;
        let name = String::from_utf8(r.take(len)?.to_vec()).ok()?;
        let n = r.count()?;
        let mut partitions = Vec::new();
        for _ in 0..n {
            partitions.push(r.i32()?);
        }
        out.push((name, partitions));
    }
    Some(out)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    /// An array length: -1 (null) is empty; a count the bytes cannot hold is malformed
    /// (and must not make us allocate for it).
    fn count(&mut self) -> Option<usize> {
        let n = self.i32()?;
        if n < 0 {
            return Some(0);
        }
        let n = usize::try_from(n).ok()?;
        (n <= self.0.len()).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(version: i16, topics: &[(&str, &[i32])], user_data: &[u8]) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((user_data.len() as i32).to_be_bytes());
        b.extend(user_data);
        b
    }

    #[test]
    fn decodes_every_version() {
        for v in 0..=3 {
            let b = encode(v, &[("orders", &[0, 2]), ("refunds", &[1])], b"x");
            assert_eq!(
                decode(&b),
                Some(vec![
                    ("orders".to_string(), vec![0, 2]),
                    ("refunds".to_string(), vec![1])
                ])
            );
        }
        assert_eq!(decode(&encode(0, &[], b"")), Some(vec![]));
    }

    #[test]
    fn malformed_bytes_are_none_not_a_panic() {
        let good = encode(1, &[("orders", &[0, 1, 2])], b"");
        for cut in 0..good.len() - 4 {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode(&[0, 0, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(decode(&[0xff, 0xff]), None);
        assert_eq!(decode(&[0, 0, 0, 0, 0, 1, 0, 2, 0xff, 0xfe]), None);
    }
}
