//! Minimal `.npy` writing, to hand inputs and outputs to peer scripts (PyTorch) so that both
//! sides are measured on the same numbers. 16-bit floats are written as their raw `<u2` bits
//! (NumPy has no bfloat16); the reader reinterprets them.

use attn_core::Buffer;
use std::io::Write;
use std::path::Path;

/// Writes `buf` as a 1-d array: `<f4` for f32, `<u2` raw bits for f16/bf16.
pub fn write(path: &Path, buf: &Buffer) -> std::io::Result<()> {
    let (descr, bytes): (&str, Vec<u8>) = match buf {
        Buffer::F32(v) => ("<f4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Buffer::F16(v) => ("<u2", v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()),
        Buffer::Bf16(v) => ("<u2", v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({},), }}", buf.len());
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of
    // 64 and ended by a newline, as the format requires.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    f.write_all(&bytes)?;
    f.flush()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_data_follows() {
        let dir = std::env::temp_dir().join(format!("attn-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.npy");
        super::write(&path, &attn_core::Buffer::F32(vec![1.0, 2.0, 3.0])).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        assert_eq!(
            &bytes[10 + hlen..],
            [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
