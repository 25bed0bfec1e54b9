// Package report turns the JSON lines of a `gorovod run --json` into a run
// report: plots as SVG and PNG (gonum.org/v1/plot) of the workers over time,
// throughput, step time and, when the trainer reports it, the loss, with the
// autoscaling engine's decisions marked on the time axis, and a one-page
// HTML summary that embeds them (`gorovod report RUN.jsonl`).
//
// Read is tolerant by design: `gorovod run --json` writes the engine's
// events and summary as JSON lines on stdout, interleaved with the workers'
// own stdout lines ("[3] ..."), and a run that was interrupted has no
// summary. Read keeps what it understands:
//   - engine events ({"event":"world"|"decision"|"done"|...}, the
//     heuristics.Event type) and the final {"event":"summary",...};
//   - progress records ({"event":"progress", ...}, Progress): the
//     throughput, step time and loss of the job over time, which the run
//     prints periodically;
//   - the trainers' per-step JSON lines as gorovod run relays them
//     ("[i] {"step":N,"loss":L,"step_ms":T,"size":K,"global":B,...}"), which
//     the example trainers print with --json;
//
// and counts the lines it skipped. Every field is optional, so both sides can
// add fields later without breaking the other.
//
// The time axis is seconds since the job's first world formed (the events'
// elapsed_s). Trainer step lines carry no time: their steps are placed on
// the axis by interpolating between the engine's (elapsed_s, step) anchors,
// which exist at every world change and decision.
package report
