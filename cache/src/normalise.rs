//! Text normalisation: what makes two queries "the same text" for an exact hit, and the words the guards read.

/// The words of `text`, lower-cased: runs of letters, digits and apostrophes (a typographic apostrophe is
/// read as `'`), a number keeping its inner `.` and `,` (`1,000.50`), and each currency sign (and `%`) as a word of its
/// own. Everything else separates words.
pub fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let c = if c == '\u{2019}' { '\'' } else { c };
        let inner_sep = (c == '.' || c == ',')
            && word.chars().last().is_some_and(|p| p.is_ascii_digit())
            && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit());
        if c.is_alphanumeric() || c == '\'' || inner_sep {
            word.extend(c.to_lowercase());
            continue;
        }
        flush(&mut word, &mut out);
        if is_currency_sign(c) {
            out.push(c.to_string());
        }
    }
    flush(&mut word, &mut out);
    out
}

fn flush(word: &mut String, out: &mut Vec<String>) {
    let w = word.trim_matches('\'');
    if !w.is_empty() {
        out.push(w.to_string());
    }
    word.clear();
}

fn is_currency_sign(c: char) -> bool {
    matches!(c, '%' | '$' | '€' | '£' | '¥' | '₹' | '₩' | '₽' | '₺' | '¢')
}

/// The text an exact hit compares: [`tokens`] joined by single spaces (case, punctuation and spacing do not
/// tell two queries apart; words, numbers and currency signs do).
pub fn normalise(text: &str) -> String {
    tokens(text).join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_spacing_and_punctuation_do_not_count_words_and_numbers_do() {
        assert_eq!(
            normalise("  Turn ON my card!!  "),
            normalise("turn on my card")
        );
        assert_ne!(normalise("turn on my card"), normalise("turn off my card"));
        assert_eq!(
            tokens("I sent £1,000.50 yesterday, didn’t arrive."),
            vec![
                "i",
                "sent",
                "£",
                "1,000.50",
                "yesterday",
                "didn't",
                "arrive"
            ]
        );
        assert_eq!(
            tokens("'quoted' words, 3.5"),
            vec!["quoted", "words", "3.5"]
        );
        assert_eq!(
            tokens("end with a number 12."),
            vec!["end", "with", "a", "number", "12"]
        );
        assert!(tokens("?!  ").is_empty());
    }
}
