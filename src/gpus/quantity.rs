//! Kubernetes quantities read exactly, as device counts.

use serde_json::Value;

use super::fields::*;
use super::*;

/// More devices than any container can have; keeps every product finite.
pub(super) const MAX_DEVICES: u128 = 1 << 32;

/// A device count: a JSON integer or a Kubernetes quantity string that is a whole,
/// non-negative number ("4", "4.0", "4000m", "1e1").
pub(super) fn device_count(v: &Value, path: &str) -> Result<f64, CountError> {
    let parsed = match v {
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Ok(u128::from(u)),
            (None, Some(f)) if f < 0.0 => Err(QuantityError::Negative),
            (None, Some(f)) if f.fract() != 0.0 => Err(QuantityError::Fractional),
            (None, Some(f)) if f <= MAX_DEVICES as f64 => Ok(f as u128),
            (None, Some(_)) => Err(QuantityError::TooLarge),
            (None, None) => Err(QuantityError::Invalid),
        },
        Value::String(s) => whole_quantity(s),
        _ => Err(QuantityError::Invalid),
    };
    let parsed = parsed.and_then(|n| {
        if n > MAX_DEVICES {
            Err(QuantityError::TooLarge)
        } else {
            Ok(n)
        }
    });
    match parsed {
        Ok(n) => Ok(n as f64),
        Err(e) => {
            let what = match e {
                QuantityError::Invalid => "expected a whole, non-negative number of devices",
                QuantityError::Negative => "expected a non-negative number of devices",
                QuantityError::Fractional => {
                    "a device count must be whole (a part of a GPU is a MIG resource)"
                }
                QuantityError::TooLarge => "the number of devices is implausibly large",
            };
            Err(problem(path, format!("{what}, found {}", found(v))))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum QuantityError {
    Invalid,
    Negative,
    Fractional,
    TooLarge,
}

/// A quantity of whole units (a ResourceQuota's `used`), `None` when it is not one.
pub fn quantity_units(s: &str) -> Option<u64> {
    whole_quantity(s).ok().and_then(|v| u64::try_from(v).ok())
}

/// Parses a Kubernetes quantity exactly, as a whole number.
pub(super) fn whole_quantity(s: &str) -> Result<u128, QuantityError> {
    use QuantityError::*;
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(Invalid);
    }
    let fraction = fraction.trim_end_matches('0');
    let (pow10, pow2): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E']).ok_or(Invalid)?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty()
                || unsigned.len() > 6
                || !unsigned.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(Invalid);
            }
            (digits.parse::<i64>().map_err(|_| Invalid)?, 0)
        }
    };
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(Negative);
    }
    let pow10 = pow10 - fraction.len() as i64;
    // More digits than u128 holds are more devices than anything has.
    if digits.len() > 38 {
        return Err(TooLarge);
    }
    let mut value: u128 = digits.parse().map_err(|_| Invalid)?;
    value = value.checked_mul(1u128 << pow2).ok_or(TooLarge)?;
    if pow10 >= 0 {
        let scale = u32::try_from(pow10)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
            .ok_or(TooLarge)?;
        value.checked_mul(scale).ok_or(TooLarge)
    } else {
        match u32::try_from(-pow10)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
        {
            Some(scale) if value.is_multiple_of(scale) => Ok(value / scale),
            _ => Err(Fractional),
        }
    }
}
