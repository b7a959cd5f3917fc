//! Adversarial review 18: `event_into`'s one-line fast path writes exactly what the line-by-line
//! path (the code before it) writes, for payloads with and without line breaks of every kind,
//! appended to a buffer that already holds frames (as a client pack does).

use super::*;

/// The frame as the line-by-line code wrote it.
fn reference(out: &mut Vec<u8>, id: Option<&str>, event: Option<&str>, data: &[u8]) -> usize {
    let start = out.len();
    if let Some(id) = id {
        push_field(out, ID, id.as_bytes());
    }
    if let Some(ev) = event {
        push_field(out, EVENT, ev.as_bytes());
    }
    for line in lines(data) {
        out.extend_from_slice(DATA);
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    out.len() - start
}

#[test]
fn adv18_one_line_fast_path_matches_the_line_by_line_frame() {
    let pieces: &[&[u8]] = &[
        b"",
        b"{}",
        b"\r",
        b"\n",
        b"\r\n",
        b"\n\r",
        b"a",
        b"\x00",
        b"\x0b\x0c",
        b"\xff",
        b" ",
        b"data: x",
        b"id: 5",
        "\u{2028}".as_bytes(),
    ];
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for a in pieces {
        for b in pieces {
            for c in pieces {
                inputs.push([*a, *b, *c].concat());
            }
        }
    }
    // Long payloads with a break at every offset around memchr's block sizes.
    for len in [31usize, 32, 33, 63, 64, 65, 4095, 4096] {
        for at in [0, 1, len / 2, len.saturating_sub(1)] {
            for brk in [b'\r', b'\n'] {
                let mut v = vec![b'x'; len];
                if at < len {
                    v[at] = brk;
                }
                inputs.push(v);
            }
        }
    }
    for data in &inputs {
        for (id, ev) in [
            (None, None),
            (Some("s:1:2"), Some("message")),
            (Some("a\rb"), None),
        ] {
            let mut want = b"prev frame\n\n".to_vec();
            let mut got = want.clone();
            let n_want = reference(&mut want, id, ev, data);
            let n_got = event_into(&mut got, id, ev, data);
            assert_eq!(got, want, "data {:?}", String::from_utf8_lossy(data));
            assert_eq!(n_got, n_want, "size of {:?}", String::from_utf8_lossy(data));
            let one = event(id, ev, data);
            assert_eq!(&one[..], &want[b"prev frame\n\n".len()..]);
        }
    }
}
