//! Prices per model (`[prices."MODEL"]`, USD per million tokens) and what a request cost.
//!
//! Cost = (input − cached) × input + cached × cached_input + output × output, in picodollars,
//! exact for prices with up to six decimals (and linear: the cost of a ledger row is the cost
//! of its token totals). A model with no price costs 0 USD (it is still counted in tokens).
//! An exact name wins over a glob; of several globs, the longest pattern.

use std::collections::BTreeMap;

use crate::config::PriceConfig;
use crate::domain::Usd;

/// A request's tokens by kind, as the provider reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Used {
    /// Input (prompt) tokens, cached ones included.
    pub input: u64,
    /// Of `input`, the cached ones.
    pub cached: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

impl Used {
    /// Input + output.
    pub fn tokens(self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// One model's prices, in picodollars per token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Per input token.
    pub input: u64,
    /// Per cached input token.
    pub cached_input: u64,
    /// Per output token.
    pub output: u64,
}

impl Price {
    /// From USD per million tokens.
    pub fn from_config(p: &PriceConfig) -> Self {
        // 1 $ per 1M tokens = 10^12 / 10^6 picodollars per token.
        let exact = |usd: f64| (usd * 1_000_000.0).round().max(0.0) as u64;
        Self {
            input: exact(p.input),
            cached_input: exact(p.cached_input.unwrap_or(p.input)),
            output: exact(p.output),
        }
    }

    /// What `u` costs.
    pub fn cost(&self, u: Used) -> Usd {
        let cached = u.cached.min(u.input);
        let total = u128::from(u.input - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(u.output) * u128::from(self.output);
        Usd(u64::try_from(total).unwrap_or(u64::MAX))
    }
}

/// Every configured price.
#[derive(Clone, Debug, Default)]
pub struct Prices {
    exact: BTreeMap<String, Price>,
    /// Glob patterns, longest first.
    globs: Vec<(String, Price)>,
}

impl Prices {
    /// From `[prices]`.
    pub fn from_config(prices: &BTreeMap<String, PriceConfig>) -> Self {
        let mut p = Self::default();
        for (name, c) in prices {
            let price = Price::from_config(c);
            if name.contains(['*', '?']) {
                p.globs.push((name.clone(), price));
            } else {
                p.exact.insert(name.clone(), price);
            }
        }
        p.globs.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
        p
    }

    /// The price of `model` (`None`: it costs nothing).
    pub fn of(&self, model: &str) -> Option<Price> {
        self.exact.get(model).copied().or_else(|| {
            self.globs
                .iter()
                .find(|(g, _)| crate::route::glob_match(g, model))
                .map(|(_, p)| *p)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(input: f64, output: f64, cached: Option<f64>) -> PriceConfig {
        PriceConfig {
            input,
            output,
            cached_input: cached,
        }
    }

    #[test]
    fn cost_is_exact_and_cached_tokens_are_priced_apart() {
        let p = Price::from_config(&price(0.15, 0.60, Some(0.075)));
        assert_eq!(p.input, 150_000, "0.15 $/M = 150000 picodollars a token");
        let used = Used {
            input: 1_000_000,
            cached: 400_000,
            output: 1_000_000,
        };
        // 0.6 M × 0.15 + 0.4 M × 0.075 + 1 M × 0.60 = 0.09 + 0.03 + 0.60.
        assert_eq!(p.cost(used), Usd::from_dollars(0.72));
        let defaulted = Price::from_config(&price(2.5, 10.0, None));
        assert_eq!(defaulted.cached_input, defaulted.input);
        // Linear: the cost of a sum is the sum of the costs.
        let (a, b) = (
            Used {
                input: 7,
                cached: 3,
                output: 11,
            },
            Used {
                input: 13,
                cached: 0,
                output: 1,
            },
        );
        let sum = Used {
            input: 20,
            cached: 3,
            output: 12,
        };
        assert_eq!(p.cost(a).0 + p.cost(b).0, p.cost(sum).0);
    }

    #[test]
    fn an_exact_name_wins_then_the_longest_glob() {
        let mut m = BTreeMap::new();
        m.insert("gpt-4o*".to_owned(), price(2.5, 10.0, None));
        m.insert("gpt-4o-mini*".to_owned(), price(0.15, 0.6, None));
        m.insert("gpt-4o-mini".to_owned(), price(1.0, 1.0, None));
        let p = Prices::from_config(&m);
        assert_eq!(p.of("gpt-4o-mini").unwrap().input, 1_000_000);
        assert_eq!(p.of("gpt-4o-mini-2024").unwrap().input, 150_000);
        assert_eq!(p.of("gpt-4o").unwrap().input, 2_500_000);
        assert_eq!(p.of("llama"), None);
    }
}
