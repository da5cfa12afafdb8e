//! The transformer, its gradients and its Adam step, written with the crate's public ops on device
//! tensors. A decoder-only (GPT-style) network over `[B, T]` token ids:
//!
//! token embedding + position embedding → 2 × [x + attention(layer_norm(x)), then
//! x + MLP(layer_norm(x))] → layer_norm → linear to the vocabulary → cross-entropy (mean).
//!
//! Attention: 4 causal heads of 16 dims, the queries, keys and values from one linear layer, the
//! heads merged by another. MLP: linear 64→256, GELU (erf), linear 256→64.
//!
//! The backward pass is written out op by op, as an autograd engine would record it: each forward
//! op saves what its gradient reads, and each backward op consumes one gradient and produces the
//! next. With mixed precision on ([`Backend::enable_mixed_precision`]) the matrix products run in
//! its 16-bit dtype (the crate casts their f32 operands), attention runs on 16-bit queries, keys and
//! values, and everything else (layer norms, GELU, the loss, the optimizer) stays in f32: PyTorch's
//! autocast rule.

use torsh_backend::compute::Distribution;
use torsh_backend::prelude::*;
use torsh_backend::LossScaler;

/// Width of the residual stream.
pub const D_MODEL: usize = 64;
/// Attention heads, and each one's width.
pub const HEADS: usize = 4;
const HEAD_DIM: usize = D_MODEL / HEADS;
/// Transformer blocks.
pub const LAYERS: usize = 2;
/// Width of the MLP's hidden layer.
const HIDDEN: usize = 4 * D_MODEL;
/// Layer norm's eps (PyTorch's default).
const EPS: f64 = 1e-5;

/// Where each parameter sits in [`Transformer::params`]: the two embeddings, then [`PER_BLOCK`]
/// tensors per block at the offsets below, then the final layer norm and the output layer.
const TOKENS: usize = 0;
const POSITIONS: usize = 1;
const BLOCKS: usize = 2;
const PER_BLOCK: usize = 12;
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const QKV_W: usize = 2;
const QKV_B: usize = 3;
const PROJ_W: usize = 4;
const PROJ_B: usize = 5;
const LN2_W: usize = 6;
const LN2_B: usize = 7;
const FC_W: usize = 8;
const FC_B: usize = 9;
const OUT_W: usize = 10;
const OUT_B: usize = 11;
const LNF_W: usize = BLOCKS + LAYERS * PER_BLOCK;
const LNF_B: usize = LNF_W + 1;
const HEAD_W: usize = LNF_W + 2;
const HEAD_B: usize = LNF_W + 3;

/// How a parameter starts.
enum Init {
    /// Normal with mean 0 and standard deviation 0.02 (GPT-2's choice, for every matrix).
    Normal,
    Zeros,
    Ones,
}

/// The shape and initial values of each parameter, in [`Transformer::params`]' order.
fn parameters(vocab: usize, context: usize) -> Vec<(Vec<usize>, Init)> {
    let mut p = vec![
        (vec![vocab, D_MODEL], Init::Normal),
        (vec![context, D_MODEL], Init::Normal),
    ];
    for _ in 0..LAYERS {
        p.extend([
            (vec![D_MODEL], Init::Ones),
            (vec![D_MODEL], Init::Zeros),
            (vec![3 * D_MODEL, D_MODEL], Init::Normal),
            (vec![3 * D_MODEL], Init::Zeros),
            (vec![D_MODEL, D_MODEL], Init::Normal),
            (vec![D_MODEL], Init::Zeros),
            (vec![D_MODEL], Init::Ones),
            (vec![D_MODEL], Init::Zeros),
            (vec![HIDDEN, D_MODEL], Init::Normal),
            (vec![HIDDEN], Init::Zeros),
            (vec![D_MODEL, HIDDEN], Init::Normal),
            (vec![D_MODEL], Init::Zeros),
        ]);
    }
    p.extend([
        (vec![D_MODEL], Init::Ones),
        (vec![D_MODEL], Init::Zeros),
        (vec![vocab, D_MODEL], Init::Normal),
        (vec![vocab], Init::Zeros),
    ]);
    p
}

/// `x · wᵀ + bias`, PyTorch's `linear`, for `x` `[rows, in]` and `w` `[out, in]`: one GEMM that
/// starts from the broadcast bias (`addmm`).
fn linear(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.gemm(&w.t()?, 1.0, bias, 1.0)
}

/// The gradients of [`linear`] from `dy`, the output's: `(dx, dw, dbias)`.
fn linear_backward(dy: &Tensor, x: &Tensor, w: &Tensor) -> Result<[Tensor; 3]> {
    Ok([dy.matmul(w)?, dy.t()?.matmul(x)?, dy.sum(0, false)?])
}

/// A dense copy of `t` in `dtype` (`t` itself when it already is one).
fn dense_as(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        t.contiguous()
    } else {
        t.cast(dtype)
    }
}

/// What one block's forward pass leaves for its backward pass.
struct Block {
    /// The block's input `[B·T, D_MODEL]`.
    input: Tensor,
    ln1: Normalized,
    /// Queries, keys and values `[B, H, T, HEAD_DIM]` in attention's dtype.
    qkv: [Tensor; 3],
    attention: AttentionOutput,
    /// The heads merged back, `[B·T, D_MODEL]`.
    heads: Tensor,
    /// The input plus attention's output.
    mid: Tensor,
    ln2: Normalized,
    /// The MLP's hidden layer before and after GELU.
    hidden: Tensor,
    activated: Tensor,
}

/// What a forward pass leaves for the backward pass, and its loss.
pub struct Forward {
    /// The mean cross-entropy loss, 0-d (`None` for a forward without targets).
    pub loss: Option<Tensor>,
    /// The output layer's `[B·T, vocab]` scores.
    pub logits: Tensor,
    tokens: Tensor,
    blocks: Vec<Block>,
    last: Tensor,
    lnf: Normalized,
}

/// The network's parameters and its optimizer state.
pub struct Transformer {
    /// The parameters: token and position embeddings, each block's 12 tensors, the final layer
    /// norm's weight and bias, and the output layer's weight and bias.
    pub params: Vec<Tensor>,
    adam: AdamState,
    lr: f32,
    context: usize,
}

impl Transformer {
    /// A network over `vocab` tokens reading up to `context` of them, its matrices drawn from the
    /// crate's seeded generator (N(0, 0.02), the same values on every backend), biases zero, layer
    /// norms the identity. Trained by Adam with learning rate `lr` and PyTorch's other defaults.
    pub fn new(
        b: &Backend,
        dtype: DType,
        vocab: usize,
        context: usize,
        seed: u64,
        lr: f32,
    ) -> Result<Transformer> {
        let normal = Distribution::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let params = parameters(vocab, context)
            .into_iter()
            .enumerate()
            .map(|(i, (shape, init))| match init {
                Init::Normal => b.random_seeded(&shape, dtype, normal, seed.wrapping_add(i as u64)),
                Init::Zeros => b.zeros(&shape, dtype),
                Init::Ones => b.ones(&shape, dtype),
            })
            .collect::<Result<_>>()?;
        Ok(Transformer {
            params,
            adam: AdamState::adam(),
            lr,
            context,
        })
    }

    /// The parameters of block `l`.
    fn block(&self, l: usize) -> &[Tensor] {
        &self.params[BLOCKS + l * PER_BLOCK..BLOCKS + (l + 1) * PER_BLOCK]
    }

    /// The forward pass over `tokens` `[B, T]` (`I64`, `T ≤ context`), keeping what
    /// [`Transformer::backward`] needs; with `targets` (`[B, T]`, the next token at each position)
    /// also the loss. `ShapeMismatch` for tokens not of rank 2 (or targets of another shape),
    /// `InvalidArgument` for a sequence longer than the context.
    pub fn forward(&self, tokens: &Tensor, targets: Option<&Tensor>) -> Result<Forward> {
        let b = tokens.backend();
        let &[batch, len] = tokens.shape() else {
            return Err(BackendError::shape(
                "char_transformer",
                format!("tokens must be [batch, len], not {:?}", tokens.shape()),
            ));
        };
        if let Some(t) = targets.filter(|t| t.shape() != [batch, len]) {
            return Err(BackendError::shape(
                "char_transformer",
                format!("targets {:?} must match tokens [{batch}, {len}]", t.shape()),
            ));
        }
        if len > self.context {
            return Err(BackendError::invalid(
                "char_transformer",
                format!("{len} tokens exceed the context of {}", self.context),
            ));
        }
        let p = &self.params;
        let dtype = p[TOKENS].dtype();
        // Attention runs in the mixed-precision dtype when there is one.
        let low = b.mixed_precision().map_or(dtype, |c| c.compute_dtype);
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let positions = p[POSITIONS].narrow(0, 0, len)?;
        let mut x = p[TOKENS]
            .embedding(tokens)?
            .add(&positions)?
            .reshape(&[batch * len, D_MODEL])?;
        let mut blocks = Vec::with_capacity(LAYERS);
        for l in 0..LAYERS {
            let w = self.block(l);
            let ln1 =
                b.layer_norm_with_stats(&x, &[D_MODEL], Some(&w[LN1_W]), Some(&w[LN1_B]), EPS)?;
            // [B·T, 3·D] → [3, B, H, T, HEAD_DIM]: queries, keys and values, each head apart.
            let qkv = linear(&ln1.output, &w[QKV_W], &w[QKV_B])?
                .reshape(&[batch, len, 3, HEADS, HEAD_DIM])?
                .permute(&[2, 0, 3, 1, 4])?;
            let part = |i: usize| dense_as(&qkv.narrow(0, i, 1)?.squeeze(0)?, low);
            let qkv = [part(0)?, part(1)?, part(2)?];
            let attention = b.attention_with_lse(&qkv[0], &qkv[1], &qkv[2], true, scale)?;
            let heads = dense_as(&attention.output.permute(&[0, 2, 1, 3])?, dtype)?
                .reshape(&[batch * len, D_MODEL])?;
            let mid = linear(&heads, &w[PROJ_W], &w[PROJ_B])?.add(&x)?;
            let ln2 =
                b.layer_norm_with_stats(&mid, &[D_MODEL], Some(&w[LN2_W]), Some(&w[LN2_B]), EPS)?;
            let hidden = linear(&ln2.output, &w[FC_W], &w[FC_B])?;
            let activated = hidden.gelu()?;
            let out = linear(&activated, &w[OUT_W], &w[OUT_B])?.add(&mid)?;
            blocks.push(Block {
                input: x,
                ln1,
                qkv,
                attention,
                heads,
                mid,
                ln2,
                hidden,
                activated,
            });
            x = out;
        }
        let lnf = b.layer_norm_with_stats(&x, &[D_MODEL], Some(&p[LNF_W]), Some(&p[LNF_B]), EPS)?;
        let logits = linear(&lnf.output, &p[HEAD_W], &p[HEAD_B])?;
        let loss = targets
            .map(|t| {
                logits.cross_entropy(&t.reshape(&[batch * len])?, CrossEntropyConfig::default())
            })
            .transpose()?;
        Ok(Forward {
            loss,
            logits,
            tokens: tokens.clone(),
            blocks,
            last: x,
            lnf,
        })
    }

    /// The gradient of `seed · loss` with respect to each parameter, in [`Transformer::params`]'
    /// order (`seed` is 1, or a loss scaler's scale). `targets` as given to
    /// [`Transformer::forward`], which must have had them.
    pub fn backward(&self, f: &Forward, targets: &Tensor, seed: f64) -> Result<Vec<Tensor>> {
        let p = &self.params;
        let b = f.logits.backend();
        let (batch, len) = (f.tokens.shape()[0], f.tokens.shape()[1]);
        let dtype = p[TOKENS].dtype();
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let mut grads: Vec<Option<Tensor>> = vec![None; p.len()];
        let mut put = |i: usize, g: Tensor| grads[i] = Some(g);

        let targets = targets.reshape(&[batch * len])?;
        let seed = b.full(&[], seed, dtype)?;
        let dlogits =
            b.cross_entropy_backward(&seed, &f.logits, &targets, CrossEntropyConfig::default())?;
        let [dlnf, dw, db] = linear_backward(&dlogits, &f.lnf.output, &p[HEAD_W])?;
        put(HEAD_W, dw);
        put(HEAD_B, db);
        let g = b.layer_norm_backward(
            &dlnf,
            &f.last,
            &[D_MODEL],
            Some(&p[LNF_W]),
            &f.lnf.mean,
            &f.lnf.invstd,
        )?;
        put(LNF_W, g.weight);
        put(LNF_B, g.bias);
        let mut dx = g.input;

        for l in (0..LAYERS).rev() {
            let (w, s, base) = (self.block(l), &f.blocks[l], BLOCKS + l * PER_BLOCK);
            // MLP: out = mid + linear(gelu(linear(ln2(mid)))).
            let [dact, dw, db] = linear_backward(&dx, &s.activated, &w[OUT_W])?;
            put(base + OUT_W, dw);
            put(base + OUT_B, db);
            let dhidden = s.hidden.unary_backward(UnaryOp::Gelu, &dact)?;
            let [dln2, dw, db] = linear_backward(&dhidden, &s.ln2.output, &w[FC_W])?;
            put(base + FC_W, dw);
            put(base + FC_B, db);
            let g = b.layer_norm_backward(
                &dln2,
                &s.mid,
                &[D_MODEL],
                Some(&w[LN2_W]),
                &s.ln2.mean,
                &s.ln2.invstd,
            )?;
            put(base + LN2_W, g.weight);
            put(base + LN2_B, g.bias);
            let dmid = dx.add(&g.input)?;
            // Attention: mid = input + linear(merge(attention(split(linear(ln1(input)))))).
            let [dheads, dw, db] = linear_backward(&dmid, &s.heads, &w[PROJ_W])?;
            put(base + PROJ_W, dw);
            put(base + PROJ_B, db);
            let low = s.qkv[0].dtype();
            let dout = dheads
                .reshape(&[batch, len, HEADS, HEAD_DIM])?
                .permute(&[0, 2, 1, 3])?;
            let [q, k, v] = &s.qkv;
            let a = &s.attention;
            let dqkv = b.attention_backward(
                &dense_as(&dout, low)?,
                q,
                k,
                v,
                &a.output,
                &a.lse,
                true,
                scale,
            )?;
            // Three [B, H, T, HEAD_DIM] → [B·T, 3·D], the layout the qkv layer produced: each
            // seen as [B, T, H, HEAD_DIM] and stacked on dim 2, one copy.
            let heads_last = |g: &Tensor| g.permute(&[0, 2, 1, 3]);
            let (dq, dk, dv) = (
                heads_last(&dqkv.q)?,
                heads_last(&dqkv.k)?,
                heads_last(&dqkv.v)?,
            );
            let dqkv = b.stack(&[&dq, &dk, &dv], 2)?;
            let dqkv = dense_as(&dqkv, dtype)?.reshape(&[batch * len, 3 * D_MODEL])?;
            let [dln1, dw, db] = linear_backward(&dqkv, &s.ln1.output, &w[QKV_W])?;
            put(base + QKV_W, dw);
            put(base + QKV_B, db);
            let g = b.layer_norm_backward(
                &dln1,
                &s.input,
                &[D_MODEL],
                Some(&w[LN1_W]),
                &s.ln1.mean,
                &s.ln1.invstd,
            )?;
            put(base + LN1_W, g.weight);
            put(base + LN1_B, g.bias);
            dx = dmid.add(&g.input)?;
        }

        // Embeddings: each token's row gathers the gradients of its positions; each position's row
        // sums over the batch (rows past the sequence get none).
        let ids = f.tokens.reshape(&[batch * len])?;
        let table = b.zeros(p[TOKENS].shape(), dtype)?;
        put(TOKENS, table.index_add(0, &ids, &dx, 1.0)?);
        let dpos = dx.reshape(&[batch, len, D_MODEL])?.sum(0, false)?;
        // (`pad` counts dims from the last.)
        put(
            POSITIONS,
            dpos.pad(&[(0, 0), (0, self.context - len)], 0.0)?,
        );
        grads
            .into_iter()
            .map(|g| {
                g.ok_or_else(|| BackendError::invalid("char_transformer", "a gradient is missing"))
            })
            .collect()
    }

    /// One Adam step on the parameters, in place.
    pub fn update(&mut self, grads: &[Tensor]) -> Result<()> {
        let b = self.params[0].backend().clone();
        b.fused_adam_step(
            &mut self.params,
            grads,
            &mut self.adam,
            self.lr,
            (0.9, 0.999),
        )
    }

    /// One step with gradients of a loss multiplied by `scaler`'s scale: unscaled, checked for
    /// inf/NaN, applied unless they hold one, and the scale updated. Returns whether the step ran.
    pub fn update_scaled(&mut self, grads: &mut [Tensor], scaler: &mut LossScaler) -> Result<bool> {
        let b = self.params[0].backend().clone();
        let ran = scaler.fused_adam_step(
            &b,
            &mut self.params,
            grads,
            &mut self.adam,
            self.lr,
            (0.9, 0.999),
        )?;
        scaler.update()?;
        Ok(ran)
    }

    /// `prompt` followed by `count` tokens, each the most likely next one given the last
    /// `context` tokens before it (greedy decoding). `InvalidArgument` for an empty prompt.
    pub fn generate(&self, b: &Backend, prompt: &[i64], count: usize) -> Result<Vec<i64>> {
        if prompt.is_empty() {
            return Err(BackendError::invalid(
                "char_transformer",
                "generation needs a prompt of at least one token",
            ));
        }
        let mut ids = prompt.to_vec();
        for _ in 0..count {
            let window = &ids[ids.len().saturating_sub(self.context)..];
            let x = b.from_slice(window, &[1, window.len()])?;
            let logits = self.forward(&x, None)?.logits;
            let next = logits.narrow(0, window.len() - 1, 1)?.argmax(1, false)?;
            ids.push(next.item()? as i64);
        }
        Ok(ids)
    }
}
