//! Just enough of Kubernetes' protobuf encoding to read the one body kubectl sends that
//! way and kube-sim accepts: a policy/v1 Eviction (from `kubectl drain`), of which only
//! `deleteOptions.dryRun` matters (name and namespace come from the URL). Everything
//! else in protobuf is refused with 415.

/// Reads a base-128 varint; `None` when truncated.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The length-delimited fields with `number` in a protobuf message, in order.
fn fields(message: &[u8], number: u64) -> Vec<&[u8]> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let Some(key) = varint(message, &mut at) else {
            break;
        };
        match key & 7 {
            0 => {
                if varint(message, &mut at).is_none() {
                    break;
                }
            }
            1 => at += 8,
            5 => at += 4,
            2 => {
                let Some(len) = varint(message, &mut at) else {
                    break;
                };
                let end = at.saturating_add(len as usize);
                let Some(value) = message.get(at..end) else {
                    break;
                };
                if key >> 3 == number {
                    found.push(value);
                }
                at = end;
            }
            _ => break,
        }
    }
    found
}

/// Whether a protobuf-encoded Eviction asks for `dryRun: [All]`.
/// Layout: "k8s\0" magic, runtime.Unknown{raw = 2}, Eviction{deleteOptions = 2},
/// DeleteOptions{dryRun = 5}.
pub fn eviction_dry_run(body: &[u8]) -> bool {
    let Some(unknown) = body.strip_prefix(b"k8s\0") else {
        return false;
    };
    fields(unknown, 2)
        .into_iter()
        .flat_map(|eviction| fields(eviction, 2))
        .flat_map(|options| fields(options, 5))
        .any(|dry_run| dry_run == b"All")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delimited(number: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, value.len() as u8];
        out.extend_from_slice(value);
        out
    }

    #[test]
    fn finds_dry_run_in_a_protobuf_eviction() {
        let options = delimited(5, b"All");
        let eviction = [delimited(1, &delimited(1, b"pod")), delimited(2, &options)].concat();
        let unknown = [delimited(1, b"typemeta"), delimited(2, &eviction)].concat();
        let body = [b"k8s\0".to_vec(), unknown.clone()].concat();
        assert!(eviction_dry_run(&body));
        let plain = [
            b"k8s\0".to_vec(),
            delimited(2, &delimited(1, &delimited(1, b"pod"))),
        ]
        .concat();
        assert!(!eviction_dry_run(&plain));
        assert!(!eviction_dry_run(b"garbage"));
        assert!(!eviction_dry_run(b"k8s\0\xff\xff\xff"));
    }
}
