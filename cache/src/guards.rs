//! The guards a semantic hit must pass: two queries close on the embedding may still want different answers
//! when one is negated and the other not ("my card arrived" / "my card has not arrived"), when their numbers,
//! amounts, dates or currencies differ ("charged twice" / "charged once", "£50" / "$50"), or when they name
//! opposite or exclusive things ("turn on" / "turn off", "visa" / "mastercard").
//!
//! The words are data ([`GuardWords`], from a TOML file; the embedded `guards-en.toml` is English): the code
//! only says how each kind is compared. Words are single [`crate::tokens`]; a multi-word phrase is refused when
//! the lists are read.

use std::collections::HashMap;

use serde::Deserialize;
use tiergate_core::fnv::Fnv;

/// The embedded English word lists.
pub const ENGLISH: &str = include_str!("../guards-en.toml");

/// The word lists, as written in the file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GuardWords {
    /// What the lists cover, for `/info` and the docs.
    #[serde(default)]
    pub covers: String,
    /// Words that negate the query they are in.
    pub negations: Vec<String>,
    /// A word ending in one of these negates too (`n't`).
    #[serde(default)]
    pub negation_suffixes: Vec<String>,
    /// Groups of words naming one quantity, date or currency (`["2", "two", "twice"]`); a token with a digit
    /// is a quantity of its own. Two queries must name the same ones.
    pub quantities: Vec<Vec<String>>,
    /// Classes of values that exclude each other (an antonym pair, card networks, account kinds): two queries
    /// that both name values of a class must name the same ones in the same order.
    #[serde(default)]
    pub exclusive: Vec<Exclusive>,
}

/// One class of exclusive values.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Exclusive {
    /// Its name (in refusals).
    pub name: String,
    /// Its values, each a group of words that say the same.
    pub groups: Vec<Vec<String>>,
}

/// The lists could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("guard words: {0}")]
    Parse(String),
    #[error("guard words: `{0}` is not one word (the guards compare single words)")]
    NotOneWord(String),
}

/// What a word is to the guards.
#[derive(Debug, Clone, Copy)]
enum Role {
    Negation,
    /// A number (its group names one with a digit): compared in order.
    Number(u64),
    /// A currency, date or unit: compared as a multiset.
    Quantity(u64),
    Exclusive {
        class: u16,
        value: u16,
    },
}

/// The compiled word lists.
#[derive(Debug, Clone)]
pub struct Guards {
    roles: HashMap<String, Vec<Role>>,
    suffixes: Vec<String>,
    classes: Vec<String>,
    covers: String,
}

/// What the guards read off one query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// It is negated.
    pub negated: bool,
    /// Its numbers in the order they appear ("20 instead of 100" is not "100 instead of 20").
    pub numbers: Vec<u64>,
    /// Its currencies, dates and units, sorted ("£50" and "50 pounds" agree).
    pub quantities: Vec<u64>,
    /// Its exclusive values (class, value) in the order they appear.
    pub exclusive: Vec<(u16, u16)>,
}

impl Features {
    /// Bytes it holds (the store's bound counts them).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + (self.numbers.len() + self.quantities.len()) * 8
            + self.exclusive.len() * 4
    }
}

/// Why the guards refused a semantic hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// One is negated, the other not.
    Negation,
    /// Their numbers, amounts, dates or currencies differ.
    Quantity,
    /// They name different values of this class.
    Exclusive(String),
}

impl Refusal {
    /// The metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::Negation => "negation",
            Refusal::Quantity => "quantity",
            Refusal::Exclusive(_) => "exclusive",
        }
    }
}

impl GuardWords {
    /// Reads the lists from TOML.
    pub fn parse(text: &str) -> Result<Self, GuardError> {
        toml::from_str(text).map_err(|e| GuardError::Parse(e.to_string()))
    }

    /// The embedded English lists.
    pub fn english() -> Result<Self, GuardError> {
        Self::parse(ENGLISH)
    }

    /// The lists in `path` (`[cache] guards`), else the embedded English ones.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, GuardError> {
        match path {
            Some(p) => Self::parse(
                &std::fs::read_to_string(p)
                    .map_err(|e| GuardError::Parse(format!("cannot read {}: {e}", p.display())))?,
            ),
            None => Self::english(),
        }
    }
}

impl Guards {
    /// Compiles the lists; a multi-word entry is refused.
    pub fn new(words: &GuardWords) -> Result<Self, GuardError> {
        let mut roles: HashMap<String, Vec<Role>> = HashMap::new();
        let mut add = |w: &str, role: Role| -> Result<(), GuardError> {
            let t = crate::tokens(w);
            match t.as_slice() {
                [one] => {
                    roles.entry(one.clone()).or_default().push(role);
                    Ok(())
                }
                _ => Err(GuardError::NotOneWord(w.to_string())),
            }
        };
        for w in &words.negations {
            add(w, Role::Negation)?;
        }
        for group in &words.quantities {
            // A group stands for its first word (a digit group for a number word, so "two" and "2" agree).
            let Some(first) = group.first() else { continue };
            let id = quantity_id(&canonical_number(first));
            let role = if first.chars().any(|c| c.is_ascii_digit()) {
                Role::Number(id)
            } else {
                Role::Quantity(id)
            };
            for w in group {
                add(w, role)?;
            }
        }
        for (c, class) in words.exclusive.iter().enumerate() {
            for (v, group) in class.groups.iter().enumerate() {
                for w in group {
                    add(
                        w,
                        Role::Exclusive {
                            class: c as u16,
                            value: v as u16,
                        },
                    )?;
                }
            }
        }
        Ok(Self {
            roles,
            suffixes: words.negation_suffixes.clone(),
            classes: words.exclusive.iter().map(|e| e.name.clone()).collect(),
            covers: words.covers.clone(),
        })
    }

    /// What the lists cover.
    pub fn covers(&self) -> &str {
        &self.covers
    }

    /// The features of `text`.
    pub fn features(&self, text: &str) -> Features {
        let mut f = Features::default();
        for t in crate::tokens(text) {
            if self.suffixes.iter().any(|s| t.ends_with(s.as_str())) {
                f.negated = true;
            }
            if t.chars().any(|c| c.is_ascii_digit()) && !self.roles.contains_key(&t) {
                f.numbers.push(quantity_id(&canonical_number(&t)));
                continue;
            }
            for role in self.roles.get(&t).map(Vec::as_slice).unwrap_or_default() {
                match *role {
                    Role::Negation => f.negated = true,
                    Role::Number(id) => f.numbers.push(id),
                    Role::Quantity(id) => f.quantities.push(id),
                    Role::Exclusive { class, value } => f.exclusive.push((class, value)),
                }
            }
        }
        f.quantities.sort_unstable();
        f
    }

    /// Whether a cached query with features `cached` may answer one with features `asked`: `Err` names the
    /// first guard that refuses.
    pub fn agree(&self, cached: &Features, asked: &Features) -> Result<(), Refusal> {
        if cached.negated != asked.negated {
            return Err(Refusal::Negation);
        }
        if cached.numbers != asked.numbers || cached.quantities != asked.quantities {
            return Err(Refusal::Quantity);
        }
        for (c, name) in self.classes.iter().enumerate() {
            let of = |f: &Features| -> Vec<u16> {
                f.exclusive
                    .iter()
                    .filter(|(k, _)| usize::from(*k) == c)
                    .map(|(_, v)| *v)
                    .collect()
            };
            let (a, b) = (of(cached), of(asked));
            if !a.is_empty() && !b.is_empty() && a != b {
                return Err(Refusal::Exclusive(name.clone()));
            }
        }
        Ok(())
    }
}

/// A number as one value: thousands separators dropped, a zero fraction dropped (`1,000.00` is `1000`).
fn canonical_number(t: &str) -> String {
    if !t.chars().any(|c| c.is_ascii_digit()) {
        return t.to_string();
    }
    let mut s: String = t.chars().filter(|c| *c != ',').collect();
    if let Some((int, frac)) = s.split_once('.') {
        if frac.chars().all(|c| c == '0') {
            s = int.to_string();
        }
    }
    s
}

fn quantity_id(canonical: &str) -> u64 {
    Fnv::new().eat(canonical.as_bytes()).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn english() -> Guards {
        let words = GuardWords::english().expect("the embedded lists parse");
        Guards::new(&words).expect("the embedded lists compile")
    }

    fn agree(a: &str, b: &str) -> Result<(), Refusal> {
        let g = english();
        g.agree(&g.features(a), &g.features(b))
    }

    #[test]
    fn negation_numbers_and_antonyms_refuse_paraphrases_pass() {
        assert_eq!(
            agree("my card arrived today", "my card hasn't arrived today"),
            Err(Refusal::Negation)
        );
        assert_eq!(
            agree("my card did arrive", "my card did not arrive"),
            Err(Refusal::Negation)
        );
        assert_eq!(
            agree("I was charged twice", "I was charged once"),
            Err(Refusal::Quantity)
        );
        assert_eq!(agree("send £50", "send $50"), Err(Refusal::Quantity));
        assert_eq!(agree("send £50", "send 50 pounds"), Ok(()));
        assert_eq!(
            agree(
                "it gave me 20 instead of 100",
                "it gave me 100 instead of 20"
            ),
            Err(Refusal::Quantity)
        );
        assert_eq!(agree("charged two times", "charged 2 times"), Ok(()));
        assert_eq!(agree("a fee of 1,000.00", "a fee of 1000"), Ok(()));
        assert!(matches!(
            agree("turn on contactless", "turn off contactless"),
            Err(Refusal::Exclusive(_))
        ));
        assert_eq!(agree("turn on my card", "activate my card please"), Ok(()));
        assert_eq!(
            agree("how do I check my balance", "what is my balance"),
            Ok(())
        );
    }

    #[test]
    fn a_phrase_in_the_lists_is_refused_and_a_file_that_does_not_parse_says_so() {
        let mut w = GuardWords::english().expect("parses");
        w.negations.push("no longer".into());
        assert!(matches!(Guards::new(&w), Err(GuardError::NotOneWord(p)) if p == "no longer"));
        assert!(matches!(
            GuardWords::parse("negations = 3"),
            Err(GuardError::Parse(_))
        ));
    }
}
