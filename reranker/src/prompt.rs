//! Rendering the route's prompt templates for one rerank (the text is config, see `tiergate_config`).

use tiergate_config::{display_label, render, PromptConfig};
use tiergate_queue::Candidate;

/// Channel scoring: the text a candidate's score is conditioned on (its label and examples).
pub fn channel_prefix(c: &Candidate, p: &PromptConfig) -> String {
    let examples: String = c
        .examples
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .take(p.max_examples)
        .map(|e| render(&p.example_line, &[("example", e)]))
        .collect();
    let label = display_label(&c.label);
    render(
        &p.label_prefix,
        &[
            ("label", &label),
            ("examples", &examples),
            ("reply", c.reply.as_deref().unwrap_or("")),
            ("description", &description(c, p)),
        ],
    )
}

/// A candidate's `{description}`: its description in the `description_line` template, or nothing when it
/// has none (so a head without descriptions is asked exactly the names-only question).
pub fn description(c: &Candidate, p: &PromptConfig) -> String {
    match c.description.as_deref().map(str::trim) {
        Some(d) if !d.is_empty() => render(&p.description_line, &[("description", d)]),
        _ => String::new(),
    }
}

/// Channel scoring: the scored text.
pub fn channel_query(text: &str, p: &PromptConfig) -> String {
    render(&p.query, &[("query", text.trim())])
}

/// Likelihood scoring: the shared prompt.
pub fn likelihood_prompt(text: &str, p: &PromptConfig) -> String {
    render(&p.likelihood_prompt, &[("query", text.trim())])
}

/// Likelihood scoring: a candidate's scored text.
pub fn likelihood_candidate(c: &Candidate, p: &PromptConfig) -> String {
    let label = display_label(&c.label);
    render(
        &p.likelihood_candidate,
        &[
            ("label", &label),
            ("reply", c.reply.as_deref().unwrap_or("")),
            ("description", &description(c, p)),
        ],
    )
}

/// Option letters, one token each in every common tokenizer (at most 10 candidates per rerank).
pub const LETTERS: &[u8] = b"ABCDEFGHIJ";

/// The option orders of a choice rerank: `orders` cyclic shifts of `0..k`, spread evenly (shift ⌊s·k/orders⌋).
/// With `orders = k` every candidate stands once at every letter, so an additive bias per letter cancels
/// exactly in the average; reversing the options instead would leave the middle one in place.
pub fn choice_orders(k: usize, orders: usize) -> Vec<Vec<usize>> {
    let n = orders.clamp(1, k.max(1));
    let mut out: Vec<Vec<usize>> = Vec::with_capacity(n);
    for s in 0..n {
        let shift = s * k / n;
        let order: Vec<usize> = (0..k).map(|pos| (pos + shift) % k).collect();
        if !out.contains(&order) {
            out.push(order);
        }
    }
    out
}

/// Choice: the multiple-choice question with the candidates in `order` (position → candidate index), each
/// option showing at most `examples` of its examples. The same text goes to a local model (inside its chat
/// template) and to a remote one (as the user message), so both engines ask the same question.
pub fn choice_question(
    text: &str,
    candidates: &[Candidate],
    order: &[usize],
    p: &PromptConfig,
    examples: usize,
) -> String {
    let options: String = order
        .iter()
        .enumerate()
        .filter_map(|(pos, &i)| Some((LETTERS.get(pos)?, candidates.get(i)?)))
        .map(|(&letter, c)| {
            let letter = (letter as char).to_string();
            let shown: String = c
                .examples
                .iter()
                .map(|e| e.trim())
                .filter(|e| !e.is_empty())
                .take(examples)
                .map(|e| render(&p.choice_example, &[("example", e)]))
                .collect();
            render(
                &p.choice_option,
                &[
                    ("letter", &letter),
                    ("label", &display_label(&c.label)),
                    ("reply", c.reply.as_deref().unwrap_or("")),
                    ("description", &description(c, p)),
                    ("examples", &shown),
                ],
            )
        })
        .collect();
    render(
        &p.choice_prompt,
        &[("query", text.trim()), ("options", &options)],
    )
}

/// Choice: per-candidate scores from the letters' log-probabilities of each order (`letter_lp[o][pos]`,
/// normalised over the letters): the mean over the orders of the log-probability each candidate got at the
/// letter it stood at, less `prior[pos]` (a content-free prior per letter; zeros when off).
pub fn average_over_orders(
    orders: &[Vec<usize>],
    letter_lp: &[Vec<f32>],
    prior: &[f32],
    k: usize,
) -> Vec<f32> {
    let mut sum = vec![0f32; k];
    let mut seen = vec![0u32; k];
    for (order, lp) in orders.iter().zip(letter_lp) {
        for (pos, &i) in order.iter().enumerate() {
            if let (Some(s), Some(v)) = (sum.get_mut(i), lp.get(pos)) {
                *s += v - prior.get(pos).copied().unwrap_or(0.0);
                seen[i] += 1;
            }
        }
    }
    sum.iter()
        .zip(&seen)
        .map(|(s, &n)| {
            if n == 0 {
                f32::NEG_INFINITY
            } else {
                s / n as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_prefix_shows_label_and_bounded_examples() {
        let p = PromptConfig {
            max_examples: 2,
            ..PromptConfig::default()
        };
        let c = Candidate {
            label: "card_arrival".into(),
            reply: None,
            description: None,
            examples: vec!["a".into(), " ".into(), "b".into(), "c".into()],
            p: 0.5,
        };
        assert_eq!(
            channel_prefix(&c, &p),
            "Messages about card arrival:\n- a\n- b\n-"
        );
        assert_eq!(channel_query(" hi ", &p), " hi\n");
    }

    #[test]
    fn a_description_is_shown_in_its_line_and_its_absence_changes_nothing() {
        let p = PromptConfig {
            max_examples: 1,
            ..PromptConfig::default()
        };
        let mut c = Candidate {
            label: "card_arrival".into(),
            reply: None,
            description: Some(" The card has not come. ".into()),
            examples: vec!["a".into()],
            p: 0.5,
        };
        assert_eq!(
            channel_prefix(&c, &p),
            "Messages about card arrival:\n  (The card has not come.)\n- a\n-"
        );
        let q = choice_question("hi", std::slice::from_ref(&c), &[0], &p, 0);
        assert!(
            q.contains("A) card arrival\n  (The card has not come.)\n"),
            "{q}"
        );
        let described = q;
        for none in [None, Some("  ".to_string())] {
            c.description = none;
            assert_eq!(
                channel_prefix(&c, &p),
                "Messages about card arrival:\n- a\n-"
            );
            let q = choice_question("hi", std::slice::from_ref(&c), &[0], &p, 0);
            assert_eq!(q, described.replace("  (The card has not come.)\n", ""));
        }
    }

    #[test]
    fn cyclic_orders_put_every_candidate_at_every_letter() {
        let o = choice_orders(5, 5);
        assert_eq!(o.len(), 5);
        for i in 0..5 {
            let mut at: Vec<usize> = o
                .iter()
                .map(|ord| ord.iter().position(|&c| c == i).unwrap())
                .collect();
            at.sort_unstable();
            assert_eq!(at, vec![0, 1, 2, 3, 4], "candidate {i}");
        }
        assert_eq!(choice_orders(5, 1), vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(
            choice_orders(4, 2),
            vec![vec![0, 1, 2, 3], vec![2, 3, 0, 1]]
        );
        assert_eq!(
            choice_orders(2, 9).len(),
            2,
            "never more orders than candidates"
        );
    }

    /// A synthetic scorer with a strong bias for the letter A: a single order picks whatever stands at A;
    /// the average over all cyclic shifts recovers the true preference exactly.
    #[test]
    fn order_averaging_cancels_a_letter_bias() {
        let truth = [0.0f32, -0.5, -1.0, -1.5, -2.0]; // candidate 0 is right
        let bias = [3.0f32, 0.0, -0.5, -0.5, -1.0]; // per letter position
        let k = truth.len();
        let ask = |order: &Vec<usize>| -> Vec<f32> {
            let raw: Vec<f32> = order
                .iter()
                .enumerate()
                .map(|(pos, &i)| truth[i] + bias[pos])
                .collect();
            let lse = raw.iter().map(|v| v.exp()).sum::<f32>().ln();
            raw.iter().map(|v| v - lse).collect()
        };
        let worst = vec![vec![4, 3, 2, 1, 0]];
        let one = average_over_orders(&worst, &[ask(&worst[0])], &[0.0; 5], k);
        let pick = |s: &[f32]| {
            s.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0
        };
        assert_eq!(
            pick(&one),
            4,
            "the biased single order picks the candidate at A"
        );
        let orders = choice_orders(k, k);
        let lps: Vec<Vec<f32>> = orders.iter().map(ask).collect();
        let avg = average_over_orders(&orders, &lps, &[0.0; 5], k);
        assert_eq!(pick(&avg), 0);
        for i in 1..k {
            // Differences between candidates are the true ones (the bias and the normaliser cancel).
            assert!(
                ((avg[0] - avg[i]) - (truth[0] - truth[i])).abs() < 1e-4,
                "{avg:?}"
            );
        }
        // A prior equal to the bias corrects even a single order.
        let fixed = average_over_orders(&worst, &[ask(&worst[0])], &bias, k);
        assert_eq!(pick(&fixed), 0);
    }

    #[test]
    fn choice_question_lists_letters_labels_and_bounded_examples() {
        let p = PromptConfig::default();
        let c = |l: &str, ex: &[&str]| Candidate {
            label: l.into(),
            reply: None,
            description: None,
            examples: ex.iter().map(|s| s.to_string()).collect(),
            p: 0.5,
        };
        let cands = vec![
            c("card_arrival", &["where is my card", "x"]),
            c("pin_blocked", &[]),
        ];
        let q = choice_question(" hi ", &cands, &[1, 0], &p, 1);
        assert!(q.starts_with("Message: hi\n"), "{q}");
        assert!(
            q.contains("A) pin blocked\nB) card arrival\n   e.g. \"where is my card\"\nAnswer"),
            "{q}"
        );
        assert!(!q.contains("\"x\""), "one example per option: {q}");
    }
}
