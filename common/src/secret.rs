//! A value that must never reach a log line.

use std::fmt;

use zeroize::Zeroize;

/// Wraps a secret (API token secret, password, LUKS passphrase). `Debug` and
/// `Display` print `***`; the value is reachable only through [`Secret::expose`],
/// so every use of it is greppable; and its memory is overwritten with
/// zeros when it is dropped (every copy: `Clone` makes one that is wiped too).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T: Zeroize>(T);

impl<T: Zeroize> Drop for Secret<T> {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl<T: Zeroize> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T: Zeroize> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T: Zeroize> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<T: Zeroize> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de, T: serde::Deserialize<'de> + Zeroize> serde::Deserialize<'de> for Secret<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_its_value() {
        let s = Secret::new("hunter2".to_string());
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            token: Secret<String>,
        }
        let h = Holder { token: s.clone() };
        assert!(!format!("{h:?}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn wipes_its_value_when_dropped() {
        struct Probe(std::rc::Rc<std::cell::Cell<bool>>);
        impl Zeroize for Probe {
            fn zeroize(&mut self) {
                self.0.set(true);
            }
        }
        let wiped = std::rc::Rc::new(std::cell::Cell::new(false));
        drop(Secret::new(Probe(wiped.clone())));
        assert!(wiped.get());
    }

    #[test]
    fn deserializes_transparently() {
        let s: Secret<String> = serde_json::from_str("\"abc\"").unwrap();
        assert_eq!(s.expose(), "abc");
    }
}
