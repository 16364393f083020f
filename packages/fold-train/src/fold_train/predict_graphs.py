"""Prediction replayed from CUDA graphs, one set of graphs per shape bucket (ScaleFold 3.3's
graphs, where users run: ``fold-train predict``).

The input is padded to its bucket (:mod:`fold_train.buckets`), then each repeated piece of work
is captured once per bucket and replayed:

* AF2: one recycling iteration (embedding, templates, extra MSA stack, Evoformer, structure
  module, heads: ``AlphaFold2.iteration``), replayed ``N_cycle`` times. Its inputs are static
  buffers: the pass's features (each pass has its own MSA sample, copied in before the replay)
  and the recycled ``m_1``, ``z``, ``x`` (zeros before the first pass, as the model's own).
* AF3: the trunk's inputs (``AlphaFold3.trunk_inputs``) once, one trunk pass
  (``trunk_cycle``) replayed ``N_cycle`` times, the diffusion conditioning's pair once, and one
  step of the EDM sampler (``fold_model.af3.diffusion.sampler_step``) replayed per noise level.
  The sampler's random draws (augmentation rotation and translation, noise) are drawn eagerly
  from the seeded generator at the unpadded size, in the order ``sample_diffusion`` draws them,
  padded with zeros and copied into static buffers with the step's noise level; so a padded,
  graphed prediction draws exactly the unpadded eager prediction's numbers. The confidence head
  runs once, eagerly.

Graphs of every bucket share one memory pool. That is safe because a prediction replays one
bucket's graphs in capture order, each reading only static buffers (allocated outside the pool)
and outputs of graphs of the same bucket captured before it, which were alive when the later
graphs were captured and so never overlap their memory.

Without graphs (``cuda_graphs=False``, the default off CUDA) the same pieces run eagerly on the
unpadded input: one code path, so the graphed prediction equals the eager one up to the padding.
The capture mechanism is :mod:`fold_train.cuda_graphs`'s (:class:`CudaGraphBackend`; tests use
:class:`EagerCapture`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
from fold_model.host_values import known_slots
from fold_ops.weight_casts import WeightCasts, weight_casts

from fold_train.buckets import Bucket, BucketPolicy, fit_to_bucket, real_extent
from fold_train.cuda_graphs import CaptureBackend, CudaGraphBackend, CudaGraphError

__all__ = ["AF2Predictor", "AF3Predictor", "DirectRun", "graphs_wanted"]

Outputs = dict[str, torch.Tensor]


def graphs_wanted(cuda_graphs: bool | None, device: torch.device | str) -> bool:
    """Whether prediction uses CUDA graphs: ``cuda_graphs`` when given, else on CUDA devices."""
    if cuda_graphs is None:
        return torch.device(device).type == "cuda"
    return bool(cuda_graphs)


def _host_facts(batch: dict[str, torch.Tensor]) -> tuple[dict[str, tuple], tuple | None]:
    """The filled slots the model's inference shortcuts read (``fold_model.host_values``),
    read once per prediction, outside every captured piece, and a key of them for the graphs;
    nothing on FakeTensors (a dry run states them itself)."""
    from fold_model.host_values import batch_slots

    facts = batch_slots(batch)
    return facts, (tuple(sorted(facts.items())) if facts else None)


class DirectRun:
    """A :class:`~fold_train.cuda_graphs.CaptureBackend` that captures nothing: each 'replay'
    runs ``fn`` eagerly and puts its results in the outputs (graphs off)."""

    def capture(self, fn: Callable[[], Outputs], warmup_fn=None
                ) -> tuple[Callable[[], None], Outputs]:
        outputs: Outputs = {}

        def replay() -> None:
            outputs.clear()
            outputs.update(fn())

        return replay, outputs


class _Predictor:
    """What both families share: the backend, the per-bucket state and graphs, timings.

    ``cuda_graphs``: None = on when ``device`` is CUDA. ``backend`` replaces the capture (tests:
    ``EagerCapture``; it implies graphs and padding). ``pad``: pad to the bucket (default: when
    graphs are on; graphs need it). ``timing``: record the wall time of each replay in
    :attr:`timings` (synchronizing the device around it). ``cast_weights_once`` (bf16): the
    weights' autocast casts made once and kept (:mod:`fold_ops.weight_casts`: the same values
    as casting them in every call, which False does)."""

    def __init__(self, model: torch.nn.Module, device: torch.device | str, *,
                 precision: str = "fp32", cuda_graphs: bool | None = None,
                 policy: BucketPolicy | None = None, backend: CaptureBackend | None = None,
                 pad: bool | None = None, timing: bool = False, cast_weights_once: bool = True
                 ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.precision = precision
        self.policy = policy or BucketPolicy()
        self.graphs = backend is not None or graphs_wanted(cuda_graphs, self.device)
        if backend is None:
            backend = (CudaGraphBackend(self.device, warmup=1) if self.graphs else DirectRun())
        self.backend = backend
        self.pad = self.graphs if pad is None else pad
        if self.graphs and not self.pad:
            raise CudaGraphError("CUDA graphs need the input padded to its bucket (pad=True)")
        self.timing = timing
        self.timings: dict[str, list[float]] = {}
        self.captures = 0
        self._states: dict[tuple, dict] = {}  # key -> static buffers and graphs of a bucket
        self._facts: dict[str, tuple] = {}  # _host_facts of the input being predicted
        self._facts_key: tuple | None = None
        # bf16: the weights' casts, made once and read by every step and every graph (their
        # tensors live as long as the predictor: a captured graph reads them at their address)
        self.weight_casts = WeightCasts() if cast_weights_once else None

    @property
    def buckets(self) -> list[tuple]:
        """The keys (bucket and shape extras) with captured graphs, in capture order."""
        return list(self._states)

    def release(self) -> None:
        """Drop every bucket's graphs and static buffers (``predict --input-dir`` moving on to
        the next bucket: the inputs come in bucket order, so they are not needed again)."""
        self._states.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @contextmanager
    def _autocast(self):
        if self.precision != "bf16":
            yield
            return
        # not autocast's weight cache, which is emptied when its context exits (a captured graph
        # would read freed casts): the predictor's own, refreshed by each prediction (_fit)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False), \
                weight_casts(self.weight_casts):
            yield

    def _fit(self, batch: dict[str, torch.Tensor], family: str,
             extent: dict[str, int] | None = None) -> tuple[dict[str, torch.Tensor], Bucket]:
        """The batch on the device, padded to its bucket (or as it is when not padding).
        ``extent``: the batch's ``real_extent`` when the caller knows it (a dry run's
        FakeTensors carry no mask values to read)."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        if self.pad:
            batch, bucket = fit_to_bucket(batch, family, self.policy)
        else:
            bucket = tuple(sorted((extent or real_extent(batch, family)).items()))
        self._facts, self._facts_key = _host_facts(batch)
        if self.weight_casts is not None:  # weights changed since the last prediction: recast
            self.weight_casts.refresh()
        return batch, bucket

    def _state(self, key: tuple) -> dict:
        """The static buffers and graphs of ``key`` (the bucket and shape extras), and of the
        feature values the model's shortcuts read (:func:`_host_facts`): a graph captured
        with the template stack skipped is not replayed for an input with templates."""
        if not self.graphs:
            self._states.clear()  # eager: nothing to keep between predictions
        if self._facts_key is not None:
            key = (*key, self._facts_key)
        return self._states.setdefault(key, {"graphs": {}})

    def _run(self, state: dict, name: str, fn: Callable[[], Outputs]) -> Outputs:
        """Replay graph ``name`` of the bucket (captured on first use)."""
        graphs = state["graphs"]
        if name not in graphs:
            with known_slots(self._facts):
                graphs[name] = self.backend.capture(fn, warmup_fn=fn)
            self.captures += self.graphs
        replay, outputs = graphs[name]
        if not self.timing:
            with known_slots(self._facts):  # (eager: the model runs in the replay)
                replay()
            return outputs
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        with known_slots(self._facts):
            replay()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.timings.setdefault(name, []).append(time.perf_counter() - t0)
        return outputs

    def _drop(self, state: dict, name: str, keys: tuple[str, ...] | None = None) -> None:
        """Eager (graphs off): forget outputs ``keys`` (None: all) of piece ``name`` that no later
        piece of this prediction reads, so their memory is free for the pieces after (at 6144
        tokens each AF3 pair ``[N, N, C_z]`` in fp32 is 18 GiB). With graphs the outputs live in
        the graph's pool and are overwritten by the next replay: nothing to free."""
        if self.graphs:
            return
        outputs = state["graphs"][name][1]
        for k in list(outputs) if keys is None else keys:
            outputs.pop(k, None)

    @staticmethod
    def _load(state: dict, name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy ``tensors`` into the bucket's static buffers ``name`` (allocated on first use,
        outside any graph pool)."""
        static = state.get(name)
        if static is None:
            static = state[name] = {k: v.detach().clone() for k, v in tensors.items()}
        else:
            for k, v in tensors.items():
                static[k].copy_(v)
        return static


class AF2Predictor(_Predictor):
    """``AlphaFold2`` prediction, one captured recycling iteration per bucket."""

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], num_recycles: int | None = None,
                 extent: dict[str, int] | None = None) -> Outputs:
        """Run ``num_recycles`` passes (default all ``R``) on a collated sample ``[B, R, ...]``;
        returns the last pass's ``final_atom_positions [B, N, 37, 3]``, ``final_atom_mask [B, N,
        37]``, ``plddt [B, N]``, ``distogram_logits [B, N, N, bins]`` (and with the pTM head
        ``tm_logits [B, N, N, bins]``) with ``N`` the padded size (the real residues first;
        fresh tensors, not graph outputs)."""
        model = self.model
        batch, bucket = self._fit(batch, "af2", extent)
        n_avail = batch["aatype"].shape[1]
        n_cycle = n_avail if num_recycles is None else num_recycles
        if not 1 <= n_cycle <= n_avail:
            raise ValueError(f"num_recycles={n_cycle} passes requested but the batch has "
                             f"R={n_avail} recycling copies of its features")
        state = self._state((bucket,))
        b, n = batch["aatype"].shape[0], batch["aatype"].shape[2]
        c_m, c_z = model.config.evoformer.c_m, model.config.evoformer.c_z
        dtype = model.dtype
        prev = self._load(state, "prev", {  # zeros: the first pass recycles nothing
            "m1": torch.zeros(b, n, c_m, dtype=dtype, device=self.device),
            "z": torch.zeros(b, n, n, c_z, dtype=dtype, device=self.device),
            "x": torch.zeros(b, n, 3, dtype=torch.float32, device=self.device)})

        returned = ["final_atom_positions", "final_atom_mask", "plddt", "distogram_logits"]
        if model.config.heads.tm_enabled:  # pTM models: PAE and pTM come from these
            returned.append("tm_logits")

        def iteration() -> Outputs:
            with self._autocast():
                out, (m1, z, x) = model.iteration(feats, (prev["m1"], prev["z"], prev["x"]))
            return {"m1": m1, "z": z, "x": x, **{k: out[k] for k in returned}}

        for cycle in range(n_cycle):
            feats = self._load(state, "feats", {k: v[:, cycle] for k, v in batch.items()
                                                if v.dim() >= 2})
            out = self._run(state, "recycle", iteration)
            if cycle < n_cycle - 1:
                for k in ("m1", "z", "x"):
                    prev[k].copy_(out[k])
                out = None  # eager: the next pass reads prev only (frees a pair and logits)
        return {k: out[k].clone() for k in returned}


class AF3Predictor(_Predictor):
    """``AlphaFold3`` prediction: captured trunk inputs, trunk pass, conditioning pair and sampler
    step per bucket (and number of samples)."""

    # the outputs with a samples dimension (dim 1), the ones a DAP prediction gathers
    PER_SAMPLE = ("x", "plddt", "pae", "pde", "tm_global", "tm_interface")
    # True: the confidence head reduces its PAE / PDE logits to PAIR_REDUCED per sample group
    # and (--chunk-size) row block (:func:`pair_reducer`); False: the plain reference, every
    # sample's logits [B, S, N, N, bins] made, then reduced (:func:`_pair_confidences`)
    reduce_in_head = True

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], *, generator: torch.Generator,
                 no_cycles: int | None = None, no_samples: int | None = None,
                 no_steps: int | None = None, extent: dict[str, int] | None = None,
                 sample_share: tuple[int, int] | None = None) -> Outputs:
        """Sample structures of a collated sample ``[B, ...]``. Returns ``x [B, S, A, 3]``,
        ``plddt [B, S, A]`` (0-100), ``distogram_logits [B, N, N, bins]`` and the pair
        confidences of :func:`_pair_confidences` (``pae``, ``pde``, ``tm_global``,
        ``tm_interface`` ``[B, S, N, N]``, ``contact_probs [B, N, N]``) at the real sizes.

        ``sample_share = (first, end)``: only samples ``first .. end - 1`` of the ``S`` (DAP
        prediction splits them over the ranks, :mod:`fold_train.predict_dap`); the random draws
        of all ``S`` are made, in the same order, and the share kept, so each sample is the one
        a whole prediction draws. The :attr:`PER_SAMPLE` outputs then hold ``end - first``
        samples (none: those outputs only, empty)."""
        from fold_model.af3.confidence import expected_value
        from fold_model.af3.diffusion import coordinate_dtype, sampler_schedule

        model = self.model
        cfg = model.config
        if model.confidence_head is None:
            raise ValueError("this AF3 model has no confidence head (confidence.enabled=false): "
                             "no pLDDT to write")
        real = extent or real_extent(batch, "af3")  # extent: see _fit
        batch, bucket = self._fit(batch, "af3", real)
        no_cycles = no_cycles or cfg.no_cycles
        S = no_samples or cfg.sampler.no_samples
        first, end = (0, S) if sample_share is None else sample_share
        share = slice(first, end)  # the samples this call keeps (all without a share)
        state = self._state((bucket, end - first))
        feats = self._load(state, "feats", batch)
        B, A = feats["atom_mask"].shape
        a_real = real["N_atom"]
        dtype = coordinate_dtype(torch.get_default_dtype())

        def trunk_inputs() -> Outputs:
            with self._autocast():
                return model.trunk_inputs(feats)

        inputs = self._run(state, "trunk_inputs", trunk_inputs)
        shapes = {"s": inputs["s_init"], "z": inputs["z_init"]}
        prev = self._load(state, "prev", {k: torch.zeros_like(v) for k, v in shapes.items()})
        prev["s"].zero_(), prev["z"].zero_()

        def trunk_cycle() -> Outputs:
            with self._autocast():
                s, z = model.trunk_cycle(feats, inputs, prev["s"], prev["z"])
            return {"s": s, "z": z}

        for _ in range(no_cycles):
            out = self._run(state, "trunk_cycle", trunk_cycle)
            prev["s"].copy_(out["s"]), prev["z"].copy_(out["z"])
        out = None
        # eager: prev holds the last pass's s, z; z_init [B, N, N, C_z] served the passes only
        self._drop(state, "trunk_cycle")
        self._drop(state, "trunk_inputs", ("z_init", "s_init", "msa", "msa_mask"))

        def pair_conditioning() -> Outputs:
            with self._autocast():
                return {**model.diffusion.prepare(feats, inputs["s_inputs"], prev["s"],
                                                  prev["z"]),
                        "distogram_logits": model.distogram_head(
                            prev["z"] + prev["z"].transpose(-2, -3))}

        cond = self._run(state, "pair_conditioning", pair_conditioning)
        n_tok = real["N_token"]
        if end == first:  # no sample on this rank (fewer samples than DAP ranks)
            from fold_train.confidence import contact_probs

            trailing = {"x": (a_real, 3), "plddt": (a_real,)}
            distogram = cond["distogram_logits"][:, :n_tok, :n_tok].float().clone()
            return {**{k: torch.zeros(B, 0, *trailing.get(k, (n_tok, n_tok)),
                                      device=self.device) for k in self.PER_SAMPLE},
                    "distogram_logits": distogram,
                    "contact_probs": contact_probs(distogram, cfg.loss.distogram_min_bin,
                                                   cfg.loss.distogram_max_bin)}

        # The sampler: host-side schedule, draws at the real atom count, padded into buffers.
        c0, steps = sampler_schedule(cfg.sampler, cfg.diffusion.sigma_data, no_steps)
        S_all = S
        x0 = c0 * torch.randn(B, S, a_real, 3, generator=generator, dtype=torch.float64,
                              device=self.device)[:, share].to(dtype)
        S = end - first  # [B, S, ...] from here on: this call's samples
        step_in = self._load(state, "sampler", {
            "x": _pad_atoms(x0, A),
            "rot": torch.zeros(B, S, 3, 3, dtype=dtype, device=self.device),
            "trans": torch.zeros(B, S, 1, 3, dtype=dtype, device=self.device),
            "noise": torch.zeros(B, S, A, 3, dtype=dtype, device=self.device),
            **{k: torch.zeros((), dtype=dtype, device=self.device)
               for k in ("t_hat", "xi_scale", "step_coef")}})
        step_in["x"].copy_(_pad_atoms(x0, A))

        def denoise(x_noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            # the diffusion module's noise-independent terms, shared by every sampler step; read
            # from ``cond`` when called, not bound to a local: a capture backend that replays
            # this closure in a later prediction of the bucket (EagerCapture) must see that
            # prediction's outputs, which are written into the same dict
            context = {k: v for k, v in cond.items() if k != "distogram_logits"}
            return model.diffusion(x_noisy, t, feats, inputs["s_inputs"], prev["s"], prev["z"],
                                   context)

        def sampler_step() -> Outputs:
            from fold_model.af3.diffusion import sampler_step as step

            with self._autocast():
                return {"x": step(denoise, step_in["x"], feats["atom_mask"], step_in["noise"],
                                  step_in["t_hat"], step_in["xi_scale"], step_in["step_coef"],
                                  step_in["rot"], step_in["trans"])}

        for t_hat, xi_scale, step_coef in steps:
            self._draw_step(step_in, generator, (B, S_all, a_real), A, cfg.diffusion, share)
            step_in["t_hat"].fill_(t_hat)
            step_in["xi_scale"].fill_(xi_scale)
            step_in["step_coef"].fill_(step_coef)
            out = self._run(state, "sampler_step", sampler_step)
            step_in["x"].copy_(out["x"])
        out = None
        x = step_in["x"]
        # eager: free what only the sampler read
        self._drop(state, "pair_conditioning", tuple(k for k in cond if k != "distogram_logits"))
        asym_id = feats["asym_id"][:, :n_tok]
        if self.reduce_in_head:  # the PAE / PDE logits reduced per sample group and row block
            with self._autocast():
                out = model.confidence_head(feats, inputs["s_inputs"], prev["s"], prev["z"], x,
                                            reduce_pair=pair_reducer(asym_id, cfg))
            pairs = {k: out[k][:, :, :n_tok, :n_tok] for k in PAIR_REDUCED}
            # the fp32 logits [B, N, N, bins] made after the head: not live while it runs
            distogram = cond["distogram_logits"][:, :n_tok, :n_tok].float().clone()
            pairs["contact_probs"] = _contact_probs(distogram, cfg)
        else:  # the reference: every sample's logits [B, S, N, N, bins], then reduced
            with self._autocast():
                out = model.confidence_head(feats, inputs["s_inputs"], prev["s"], prev["z"], x)
            distogram = cond["distogram_logits"][:, :n_tok, :n_tok].float().clone()
            pairs = _pair_confidences(out, asym_id, distogram, cfg)
        plddt = expected_value(out["plddt"].float(), 100.0)  # [B, S, A]
        return {"x": x[:, :, :a_real].float().clone(), "plddt": plddt[:, :, :a_real],
                "distogram_logits": distogram, **pairs}

    def _draw_step(self, step_in: dict, generator, shape: tuple[int, int, int], a_pad: int,
                   diffusion_cfg, share: slice = slice(None)) -> None:
        """One step's draws for all ``shape[1]`` samples; the ``share`` of them kept."""
        from fold_model.af3.diffusion import draw_sampler_noise

        draws = draw_sampler_noise(shape, generator, self.device,
                                   diffusion_cfg.augment_translation)
        step_in["rot"].copy_(draws["rot"][:, share])
        step_in["trans"].copy_(draws["trans"][:, share])
        step_in["noise"].copy_(_pad_atoms(draws["noise"][:, share], a_pad))


# the pair confidences reduced from the PAE / PDE logits, each [B, S, N, N]
PAIR_REDUCED = ("pae", "pde", "tm_global", "tm_interface")


def _pae_centres(c, device) -> torch.Tensor:
    """The PAE head's bin centres ``[bins]``: 0.5 A bins from 0 (section 4.3)."""
    return (torch.arange(c.pae_no_bins, device=device, dtype=torch.float32)
            + 0.5) * c.pae_max / c.pae_no_bins


def _contact_probs(distogram: torch.Tensor, cfg) -> torch.Tensor:
    from fold_train.confidence import contact_probs

    return contact_probs(distogram, cfg.loss.distogram_min_bin, cfg.loss.distogram_max_bin)


def pair_reducer(asym_id: torch.Tensor, cfg):
    """The confidence head's ``reduce_pair`` (``fold_model.af3.confidence.PairReducer``) for
    the real tokens ``asym_id [B, n]``: PAE / PDE logits ``[B, G, R, N, bins]`` of the pair rows
    ``rows`` (``N >= n``: the head may see padded tokens) -> the :data:`PAIR_REDUCED` outputs
    ``[B, G, R, N]`` of :func:`_pair_confidences`, the same formulas pair by pair. Outputs at
    padded tokens are garbage, cut off by the caller."""
    from fold_model.af3.confidence import expected_value

    from fold_train.confidence import interface_token_counts, tm_adjusted_pae

    c = cfg.confidence
    n = asym_id.shape[-1]
    counts = torch.stack([interface_token_counts(a) for a in asym_id])  # [B, n, n]
    padded: dict[int, torch.Tensor] = {}  # the counts padded to the head's N, made once

    def reduce(logits: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
        pae = logits["pae"].float()  # [B, G, R, N, bins]
        n_pad = pae.shape[-2]
        # the chain-pair normaliser of these rows; padded tokens get n (any count works: cut)
        if n_pad not in padded:
            padded[n_pad] = torch.nn.functional.pad(counts, (0, n_pad - n, 0, n_pad - n),
                                                    value=n)  # [B, N, N]
        centres = _pae_centres(c, pae.device)
        return {"pae": expected_value(pae, c.pae_max),
                "pde": expected_value(logits["pde"].float(), c.pde_max),
                "tm_global": tm_adjusted_pae(pae, centres, torch.tensor(float(n))),
                "tm_interface": tm_adjusted_pae(pae, centres, padded[n_pad][:, None, rows])}

    return reduce


def _pair_confidences(logits: Outputs, asym_id: torch.Tensor, distogram: torch.Tensor, cfg
                      ) -> Outputs:
    """The confidence head's pair outputs reduced on the device (the ``[B, S, N, N, bins]``
    logits never leave it), at the real tokens ``asym_id [B, N]``: ``pae``, ``pde`` ``[B, S, N,
    N]`` (A), the TM-adjusted PAE with the whole complex's normaliser (``tm_global``: pTM,
    ipTM) and with each chain pair's (``tm_interface``: chain-pair ipTM) ``[B, S, N, N]``, and
    ``contact_probs [B, N, N]`` from the distogram (:mod:`fold_train.confidence`). The plain
    reference of :func:`pair_reducer` (``AF3Predictor.reduce_in_head = False``)."""
    from fold_model.af3.confidence import expected_value

    from fold_train.confidence import interface_token_counts, tm_adjusted_pae

    c = cfg.confidence
    n = asym_id.shape[-1]
    pae_logits = logits["pae"][:, :, :n, :n].float()  # [B, S, N, N, bins]
    centres = _pae_centres(c, pae_logits.device)
    # per batch element: interface_token_counts takes one complex's asym_id [N]
    pair_counts = torch.stack([interface_token_counts(a) for a in asym_id])[:, None]  # [B,1,N,N]
    return {
        "pae": expected_value(pae_logits, c.pae_max),
        "pde": expected_value(logits["pde"][:, :, :n, :n].float(), c.pde_max),
        "tm_global": tm_adjusted_pae(pae_logits, centres, torch.tensor(float(n))),
        "tm_interface": tm_adjusted_pae(pae_logits, centres, pair_counts),
        "contact_probs": _contact_probs(distogram, cfg),
    }


def _pad_atoms(x: torch.Tensor, a_pad: int) -> torch.Tensor:
    """``x [B, S, A, 3]`` with zero atoms appended up to ``a_pad``."""
    return torch.nn.functional.pad(x, (0, 0, 0, a_pad - x.shape[-2]))

