"""Knowledge transfer from the GEM teacher to vertical students.

Modules, one job each:

- :mod:`~trainer.distill.records`: the teacher-output rows (Arrow / Parquet)
  and their join to examples;
- :mod:`~trainer.distill.teacher` / :mod:`~trainer.distill.teacher_pass`:
  the teacher checkpoint and the job that runs it once per example;
- :mod:`~trainer.distill.student`: the compact per-domain DLRM student;
- :mod:`~trainer.distill.losses`, :mod:`~trainer.distill.adapter`,
  :mod:`~trainer.distill.sharing`: the transfer methods;
- :mod:`~trainer.distill.student_trainer` / :mod:`~trainer.distill.run`: training a
  student, and the batch CLI ``python -m trainer.distill``;
- :mod:`~trainer.distill.teacher_topic` / :mod:`~trainer.distill.student_daemon`:
  the stream form (teacher outputs over Kafka; a student daemon per domain
  with the trainer daemon's checkpoint guarantees, both topics' offsets).

What is public and what is ours (docs/model.md):

- **Public (ExFM, arXiv 2502.17494)**: external distillation with the
  teacher run once per example (DAS), the auxiliary distillation head with
  label scaling α, loss weight w and gradient scaling β (Eq. 3-5), the
  Student Adapter ``MLP(ŷ_F)`` trained on fresh labels and used as a
  stop-gradient soft target for a second head (Eq. 6-7). Standard KD is
  Hinton et al. (2015). The equations were transcribed from an unofficial
  re-implementation (docs/model.md), not checked against the PDF.
- **Ours**: the adapter's extra inputs (domain, objective, staleness), its
  identity initialisation and "score before learning" order, and its
  calibration filter (a per-domain logit offset with a level and a slope in
  staleness, updated by a Kalman filter on the freshest labels); the student
  architecture (per domain, torchrec DLRM arches over non-sequential
  features); representation transfer as "teacher summary embedding = student
  dense input" (LoopFM describes the idea, not this form); parameter sharing
  as "id tables copied from the teacher checkpoint" (GEM's "selectively
  incorporate components" is not detailed anywhere public); the knob values.
"""
