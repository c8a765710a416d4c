//! Timestamps on the wire: `google.protobuf.Timestamp` from the UTC times the databases
//! store, encoded the same way by every service.

use chrono::{DateTime, Utc};
use prost_types::Timestamp;

/// Encodes a UTC time as a protobuf `Timestamp` (seconds and nanoseconds since the epoch).
pub fn to_proto(at: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: at.timestamp(),
        // Always below 2·10⁹ (a leap second at most doubles 10⁹), so it fits.
        nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(i32::MAX),
    }
}

/// Decodes a protobuf `Timestamp`; `None` when it lies outside what a UTC time can hold or
/// its nanoseconds are out of range.
pub fn from_proto(at: &Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(at.nanos).ok()?;
    DateTime::from_timestamp(at.seconds, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_nanoseconds_are_kept() {
        let at = DateTime::from_timestamp(1_764_547_200, 123_456_000).expect("valid");
        assert_eq!(
            to_proto(at),
            Timestamp {
                seconds: 1_764_547_200,
                nanos: 123_456_000
            }
        );
        assert_eq!(from_proto(&to_proto(at)), Some(at));
    }

    #[test]
    fn negative_nanoseconds_are_refused() {
        let at = Timestamp {
            seconds: 1_764_547_200,
            nanos: -1,
        };
        assert_eq!(from_proto(&at), None);
    }
}
