//! Attention: shapes, head dims and masks that do not fit.

use super::*;

// ---------------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------------

#[test]
fn attention_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let q = upload(c, &[0.5; 8]);
        let kv = upload(c, &[0.25; 8]);
        let o = c.alloc(32).expect("alloc");
        let desc = AttentionDesc {
            dtype: DType::F32,
            q,
            k: kv,
            v: kv,
            o,
            batch: 1,
            heads: 1,
            seq_q: 2,
            seq_kv: 0,
            head_dim: 4,
            scale: 0.5,
            causal: false,
            lse: None,
        };
        let err = assert_err!(c.attention(&desc), InvalidArgument);
        assert_mentions(&err, &["attention", "seq_kv"]);
        assert_err!(
            c.attention(&AttentionDesc {
                causal: true,
                ..desc.clone()
            }),
            InvalidArgument
        );
        // seq_q = 0 too: nothing to compute, legal
        assert_ok!(c.attention(&AttentionDesc {
            seq_q: 0,
            ..desc.clone()
        }));
        let valid = AttentionDesc {
            seq_kv: 2,
            ..desc.clone()
        };
        assert_err!(
            c.attention(&AttentionDesc {
                scale: f64::NAN,
                ..valid.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.attention(&AttentionDesc {
                dtype: DType::I32,
                ..valid.clone()
            }),
            Unsupported
        );
        assert_err!(
            c.attention(&AttentionDesc {
                o: q,
                ..valid.clone()
            }),
            Aliasing
        );
        assert_ok!(c.attention(&valid));
        assert_close(&download(c, o, 8), &[0.25; 8], 1e-6);

        // Tensor level.
        let tq = seq(&b, &[1, 1, 2, 4]);
        let tk = b.empty(&[1, 1, 0, 4], DType::F32).expect("empty");
        assert_err!(b.attention(&tq, &tk, &tk, false), InvalidArgument);
        assert_err!(b.attention(&tq, &tk, &tk, true), InvalidArgument);
        let tk2 = seq(&b, &[1, 1, 3, 4]);
        assert_err!(
            b.attention_with_scale(&tq, &tk2, &tk2, false, f64::INFINITY),
            InvalidArgument
        );
        let y = assert_ok!(b.attention(&tq, &tk2, &tk2, true));
        assert_eq!(y.shape(), &[1, 1, 2, 4]);

        for p in [q, kv, o] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}
