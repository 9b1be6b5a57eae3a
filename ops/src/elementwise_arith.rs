//! Per-element arithmetic of the binary operators for every numeric host type: the float
//! semantics of IEEE/numpy and C-like integer semantics (wrapping, truncating division,
//! division by zero giving 0 instead of trapping).
//!
//! Sits between `binary.rs` (which picks a function per op kind and loops over broadcast
//! runs) and the element types of [`crate::Data`].

use crate::elementwise_common::Elem;
use half::f16;

/// Arithmetic of one element type. All functions are total (never panic).
pub(crate) trait Arith: Elem + PartialOrd {
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    /// Floats: IEEE division. Integers: truncates toward zero; x / 0 = 0.
    fn div(a: Self, b: Self) -> Self;
    fn pow(a: Self, b: Self) -> Self;
    /// The larger operand; NaN if either is NaN.
    fn max(a: Self, b: Self) -> Self;
    /// The smaller operand; NaN if either is NaN.
    fn min(a: Self, b: Self) -> Self;
    /// Remainder with the sign of the dividend (C fmod); x % 0 = 0 for integers.
    fn rem_trunc(a: Self, b: Self) -> Self;
    /// Remainder with the sign of the divisor (Python/numpy mod).
    fn rem_floor(a: Self, b: Self) -> Self;
    /// PRelu: `a` if `a >= 0`, else `a * slope`.
    fn prelu(a: Self, slope: Self) -> Self;
    /// `n` as this type (Mean's divisor).
    fn from_count(n: usize) -> Self;
}

impl Arith for f32 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    #[inline(always)]
    fn pow(a: Self, b: Self) -> Self {
        if b == 2.0 {
            a * a
        } else {
            a.powf(b)
        }
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        if a > b || a.is_nan() {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        if a < b || a.is_nan() {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn rem_trunc(a: Self, b: Self) -> Self {
        a % b
    }
    #[inline(always)]
    fn rem_floor(a: Self, b: Self) -> Self {
        let r = a % b;
        if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
            r + b
        } else {
            r
        }
    }
    #[inline(always)]
    fn prelu(a: Self, slope: Self) -> Self {
        if a < 0.0 {
            a * slope
        } else {
            a
        }
    }
    fn from_count(n: usize) -> Self {
        n as f32
    }
}

impl Arith for f64 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    fn pow(a: Self, b: Self) -> Self {
        a.powf(b)
    }
    fn max(a: Self, b: Self) -> Self {
        if a > b || a.is_nan() {
            a
        } else {
            b
        }
    }
    fn min(a: Self, b: Self) -> Self {
        if a < b || a.is_nan() {
            a
        } else {
            b
        }
    }
    fn rem_trunc(a: Self, b: Self) -> Self {
        a % b
    }
    fn rem_floor(a: Self, b: Self) -> Self {
        let r = a % b;
        if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
            r + b
        } else {
            r
        }
    }
    fn prelu(a: Self, slope: Self) -> Self {
        if a < 0.0 {
            a * slope
        } else {
            a
        }
    }
    fn from_count(n: usize) -> Self {
        n as f64
    }
}

/// f16 arithmetic computed in f32 and rounded once.
impl Arith for f16 {
    fn add(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() + b.to_f32())
    }
    fn sub(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() - b.to_f32())
    }
    fn mul(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() * b.to_f32())
    }
    fn div(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() / b.to_f32())
    }
    fn pow(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32().powf(b.to_f32()))
    }
    fn max(a: Self, b: Self) -> Self {
        f16::from_f32(<f32 as Arith>::max(a.to_f32(), b.to_f32()))
    }
    fn min(a: Self, b: Self) -> Self {
        f16::from_f32(<f32 as Arith>::min(a.to_f32(), b.to_f32()))
    }
    fn rem_trunc(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() % b.to_f32())
    }
    fn rem_floor(a: Self, b: Self) -> Self {
        f16::from_f32(<f32 as Arith>::rem_floor(a.to_f32(), b.to_f32()))
    }
    fn prelu(a: Self, slope: Self) -> Self {
        f16::from_f32(<f32 as Arith>::prelu(a.to_f32(), slope.to_f32()))
    }
    fn from_count(n: usize) -> Self {
        f16::from_f32(n as f32)
    }
}

/// Implements [`Arith`] for a primitive integer type with wrapping C semantics.
macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn sub(a: Self, b: Self) -> Self {
                a.wrapping_sub(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn div(a: Self, b: Self) -> Self {
                if b == 0 {
                    0
                } else {
                    a.wrapping_div(b)
                }
            }
            fn pow(a: Self, b: Self) -> Self {
                #[allow(unused_comparisons)]
                if b < 0 {
                    // a^-n: only |a| == 1 has a non-zero integer result.
                    #[allow(unused_comparisons)]
                    return if a == 1 {
                        1
                    } else if a == 0 {
                        0
                    } else if a.wrapping_add(1) == 0 {
                        if b % 2 == 0 {
                            1
                        } else {
                            a
                        }
                    } else {
                        0
                    };
                }
                a.wrapping_pow(u32::try_from(b).unwrap_or(u32::MAX))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn rem_trunc(a: Self, b: Self) -> Self {
                if b == 0 {
                    0
                } else {
                    a.wrapping_rem(b)
                }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn rem_floor(a: Self, b: Self) -> Self {
                let r = Self::rem_trunc(a, b);
                if r != 0 && ((r < 0) != (b < 0)) {
                    r.wrapping_add(b)
                } else {
                    r
                }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn prelu(a: Self, slope: Self) -> Self {
                if a < 0 {
                    a.wrapping_mul(slope)
                } else {
                    a
                }
            }
            fn from_count(n: usize) -> Self {
                n as Self
            }
        }
    };
}

int_arith!(i64);
int_arith!(i32);
int_arith!(i8);
int_arith!(u8);
