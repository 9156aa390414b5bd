//! Route sources for benchmarks that replay expert requests through the real residency code: a
//! uniform generator, a Zipf generator with temporal locality (the calibrated model of
//! `docs/performance.md` §3.3), and the `.npy` readers of recorded traces (`crate::trace` reads
//! whole trace directories; `crate::replay` holds Belady-OPT, the upper bound on hit rate).

/// A deterministic generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// One layer's Zipf + stickiness + drifting-topic router (§3.3).
#[derive(Debug, Clone)]
pub struct ZipfLayer {
    base: Vec<f64>,
    topic: Vec<f64>,
    ema: Vec<f64>,
    k: usize,
    beta: f64,
    lambda: f64,
    sigma_c: f64,
    rho: f64,
}

impl ZipfLayer {
    /// `e` experts, top-`k`, Zipf exponent `s`, stickiness `beta`, EMA decay `lambda`, topic
    /// drift deviation `sigma_c` (AR(1), ρ = 0.995). Profile B of the spec: s 0.6, β 2, λ 0.6, σ 1.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        e: usize,
        k: usize,
        s: f64,
        beta: f64,
        lambda: f64,
        sigma_c: f64,
        rng: &mut Rng,
    ) -> Self {
        let mut perm: Vec<usize> = (0..e).collect();
        for i in (1..e).rev() {
            perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut base = vec![0.0; e];
        for (rank, &x) in perm.iter().enumerate() {
            base[x] = -s * ((rank + 1) as f64).ln();
        }
        let topic = (0..e).map(|_| rng.normal() * sigma_c).collect();
        ZipfLayer {
            base,
            topic,
            ema: vec![0.0; e],
            k,
            beta,
            lambda,
            sigma_c,
            rho: 0.995,
        }
    }

    /// The next token's experts (selection order: best first).
    pub fn step(&mut self, rng: &mut Rng) -> Vec<u32> {
        let innov = self.sigma_c * (1.0 - self.rho * self.rho).sqrt();
        for t in &mut self.topic {
            *t = self.rho * *t + innov * rng.normal();
        }
        let mut score: Vec<(f64, u32)> = (0..self.base.len())
            .map(|i| {
                let gumbel = -(-rng.unit().max(1e-300).ln()).ln();
                (
                    self.base[i] + self.topic[i] + self.beta * self.ema[i] + gumbel,
                    i as u32,
                )
            })
            .collect();
        score.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let chosen: Vec<u32> = score[..self.k].iter().map(|x| x.1).collect();
        for (i, r) in self.ema.iter_mut().enumerate() {
            let hit = chosen.contains(&(i as u32)) as u8 as f64;
            *r = self.lambda * *r + (1.0 - self.lambda) * hit;
        }
        chosen
    }
}

/// `k` distinct experts out of `e`, uniformly.
pub fn uniform(e: usize, k: usize, rng: &mut Rng) -> Vec<u32> {
    let mut out = Vec::with_capacity(k);
    while out.len() < k.min(e) {
        let x = (rng.next_u64() % e as u64) as u32;
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// Reads a C-order int8 or little-endian int16 `.npy` array of expert ids (the 32-expert traces
/// store int8, the 256-expert ones int16): `(shape, ids)`.
pub fn read_npy_ids(bytes: &[u8]) -> Result<(Vec<usize>, Vec<i32>), String> {
    // The dtype decides the reader, so a truncated or malformed int16 file reports what is wrong
    // with it rather than that it is not int8.
    match read_npy(bytes, &["'<i2'"], 2) {
        Err(e) if e.starts_with("expected dtype") => read_npy(bytes, &["'|i1'", "'i1'"], 1)
            .map(|(shape, data)| (shape, data.iter().map(|&b| b as i8 as i32).collect()))
            .map_err(|e| e.replace("expected dtype '|i1'", "expected dtype '|i1' or '<i2'")),
        r => r.map(|(shape, data)| {
            let ids = data
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i32)
                .collect();
            (shape, ids)
        }),
    }
}

/// Reads a C-order little-endian uint16 `.npy` array (the traces' token ids): `(shape, data)`.
pub fn read_npy_u16(bytes: &[u8]) -> Result<(Vec<usize>, Vec<u16>), String> {
    let (shape, data) = read_npy(bytes, &["'<u2'"], 2)?;
    Ok((
        shape,
        data.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect(),
    ))
}

/// The shape and raw data bytes of a C-order `.npy` array whose dtype is one of `dtypes`.
fn read_npy<'a>(
    bytes: &'a [u8],
    dtypes: &[&str],
    elem: usize,
) -> Result<(Vec<usize>, &'a [u8]), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (hlen, off) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = std::str::from_utf8(bytes.get(off..off + hlen).ok_or("truncated .npy header")?)
        .map_err(|_| "non-UTF-8 .npy header")?;
    if !dtypes.iter().any(|d| header.contains(d)) {
        return Err(format!("expected dtype {}, header {header}", dtypes[0]));
    }
    if header.contains("'fortran_order': True") {
        return Err("fortran-order arrays are not supported".into());
    }
    let shape_s = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or("no shape in .npy header")?;
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad shape `{shape_s}`")))
        .collect::<Result<_, _>>()?;
    let n = shape
        .iter()
        .try_fold(elem, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape `{shape_s}` overflows"))?;
    let start = off + hlen;
    let data = bytes.get(start..start.saturating_add(n)).ok_or_else(|| {
        format!(
            "truncated .npy data: shape ({shape_s}) needs {n} bytes after the header, the file has {}",
            bytes.len() - start.min(bytes.len())
        )
    })?;
    Ok((shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_deterministic_and_valid() {
        let mut r = Rng::new(3);
        let mut z = ZipfLayer::new(256, 8, 0.6, 2.0, 0.6, 1.0, &mut r);
        let a = z.step(&mut r);
        assert_eq!(a.len(), 8);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        let u = uniform(32, 4, &mut Rng::new(1));
        assert_eq!(u, uniform(32, 4, &mut Rng::new(1)));
    }

    #[test]
    fn npy_round_trip() {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '|i1', 'fortran_order': False, 'shape': (2, 3), }         \n";
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend([1u8, 2, 3, 0xff, 5, 6]);
        let (shape, d) = read_npy_ids(&b).unwrap();
        assert_eq!(shape, [2, 3]);
        assert_eq!(d, [1, 2, 3, -1, 5, 6]);
        assert!(read_npy_ids(&b[..20]).is_err());
        assert!(read_npy_u16(&b).unwrap_err().contains("<u2"));
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }         \n";
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend([1u8, 0, 0, 1, 0xff, 0xff]);
        assert_eq!(read_npy_u16(&b).unwrap(), (vec![3], vec![1, 256, 65535]));
        assert!(read_npy_u16(&b[..b.len() - 1]).is_err());
        assert!(read_npy_ids(&b).unwrap_err().contains("'<i2'"));
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }         \n";
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend([0xffu8, 0xff, 0xff, 0x00]);
        assert_eq!(read_npy_ids(&b).unwrap(), (vec![2], vec![-1, 255]));
        // A truncated int16 file says so (not that its dtype is wrong).
        let e = read_npy_ids(&b[..b.len() - 1]).unwrap_err();
        assert!(
            e.contains("truncated .npy data") && e.contains("needs 4 bytes"),
            "{e}"
        );
        // A shape whose size overflows is an error, not a wrapped length.
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<i2', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n";
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        assert!(read_npy_ids(&b).unwrap_err().contains("overflows"));
    }
}
