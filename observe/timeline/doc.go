// Package timeline writes what a process of a gorovod job does as a Chrome
// trace: the Trace Event Format's JSON, which chrome://tracing and Perfetto
// (ui.perfetto.dev) load. Each worker process is a trace process and its
// activities are threads (tracks): the collectives with their phases, the
// elastic layer's world switches and state broadcasts, the trainer's steps,
// stall warnings. Horovod users know it as --timeline-filename.
//
// It is cheap enough to leave on. Recording an event copies a fixed-size
// struct into a preallocated buffer under a mutex — no allocation, no I/O,
// no formatting — and a background goroutine swaps the buffer for a spare
// one and writes the events out. Memory is bounded by two buffers of
// Config.Capacity events: when the writer falls behind, new events are
// dropped and counted (and the count is written into the trace), the traced
// program is never slowed down.
//
// Files are written in the JSON array format, "[" then one event per line,
// with the separating comma before each event, so that a process killed
// mid-run leaves a file that both viewers load (they accept the missing
// closing bracket); Close writes it. Merge combines the files of a job's
// processes, repairing cut-off ones, into one trace.
//
// CollectiveTracer adapts a Timeline to collective.Tracer: every collective
// becomes a complete event named after it (allreduce, broadcast, ...) with
// its sequence number, algorithm, dtype, reduce op, bytes, world epoch and
// rank, and its phases (the ring's reduce-scatter and allgather, the rounds
// of recursive doubling) nest inside it.
package timeline
