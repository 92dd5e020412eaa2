//! Admission's first decision, the request's size against the tenant's caps: estimated input
//! tokens against `max_input_tokens`, the output cap times the choices against
//! `max_output_tokens` (400, naming the field to blame). Pure: no state is charged.

use super::Error;
use crate::config::TenantLimits;

/// What the size caps look at: the estimate's counted input, output cap and choices, and the
/// fields that set the cap and the choices (for the error's `param`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Size {
    /// Estimated input tokens.
    pub input_tokens: u64,
    /// The output cap asked for, if any.
    pub output_cap: Option<u64>,
    /// Choices generated (`n`, `best_of`, array prompts).
    pub choices: u64,
    /// The field that gave the output cap.
    pub cap_param: &'static str,
    /// The field that gave the choices, if not the default.
    pub choices_param: Option<&'static str>,
}

/// `Ok` when `size` is within `limits`' caps, else the refusal naming the field: the cap's
/// own field when the cap alone passes the limit, else what multiplied it (`n`, `best_of`, or
/// `prompt` for an array of prompts).
pub(super) fn check(limits: &TenantLimits, size: Size) -> Result<(), Error> {
    if size.input_tokens > limits.max_input_tokens {
        return Err(Error::InputTooLarge {
            estimated: size.input_tokens,
            max: limits.max_input_tokens,
        });
    }
    let Some(cap) = size.output_cap else {
        return Ok(());
    };
    // Every choice may produce the cap: `n`, `best_of` and array prompts multiply it.
    let requested = cap.saturating_mul(size.choices.max(1));
    let max = limits.max_output_tokens;
    if requested <= max {
        return Ok(());
    }
    let param = if cap > max {
        size.cap_param
    } else {
        size.choices_param.unwrap_or("prompt")
    };
    Err(Error::OutputTooLarge {
        requested,
        max,
        param,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TenantLimits {
        TenantLimits {
            max_input_tokens: 1000,
            max_output_tokens: 100,
            ..TenantLimits::default()
        }
    }

    fn size(input_tokens: u64, output_cap: Option<u64>, choices: u64) -> Size {
        Size {
            input_tokens,
            output_cap,
            choices,
            cap_param: "max_completion_tokens",
            choices_param: (choices > 1).then_some("n"),
        }
    }

    #[test]
    fn within_the_caps_passes_and_at_the_cap_too() {
        check(&limits(), size(1000, Some(100), 1)).unwrap();
        check(&limits(), size(0, None, 50)).unwrap();
        check(&limits(), size(10, Some(50), 2)).unwrap();
        check(&limits(), size(10, Some(0), 0)).unwrap();
    }

    #[test]
    fn input_over_its_cap_is_refused_first() {
        let e = check(&limits(), size(1001, Some(1_000_000), 9)).unwrap_err();
        assert!(matches!(
            e,
            Error::InputTooLarge {
                estimated: 1001,
                max: 1000
            }
        ));
    }

    #[test]
    fn the_field_blamed_is_the_cap_or_what_multiplied_it() {
        let blamed = |s: Size| match check(&limits(), s) {
            Err(Error::OutputTooLarge {
                requested, param, ..
            }) => (requested, param),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            blamed(size(1, Some(101), 1)),
            (101, "max_completion_tokens")
        );
        assert_eq!(
            blamed(size(1, Some(101), 3)),
            (303, "max_completion_tokens")
        );
        assert_eq!(blamed(size(1, Some(60), 2)), (120, "n"));
        let prompts = Size {
            choices_param: None,
            ..size(1, Some(60), 2)
        };
        assert_eq!(blamed(prompts), (120, "prompt"));
        assert_eq!(blamed(size(1, Some(u64::MAX), 2)).0, u64::MAX, "saturates");
    }
}
