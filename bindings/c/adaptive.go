package main

/*
#include "gorovod_adaptive.h"
*/
import "C"

import (
	"fmt"
	"math"

	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/heuristics/goodput"
	gsync "github.com/gorovod/gorovod/sync"
)

// The exports behind gorovod_adaptive.h.

//export gorovodGoAdaptiveStart
func gorovodGoAdaptiveStart(initBatch, maxBatch, minLocal, maxLocal C.int64_t, accumulation, rule C.int) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	rules := map[C.int]goodput.LRRule{C.GOROVOD_LR_ADASCALE: goodput.AdaScale, C.GOROVOD_LR_SQRT: goodput.SqrtScale, C.GOROVOD_LR_LINEAR: goodput.LinearScale}
	r, ok := rules[rule]
	if !ok {
		return status(fmt.Errorf("%w: learning-rate rule %d (want GOROVOD_LR_ADASCALE, _SQRT or _LINEAR)", engine.ErrInvalid, rule))
	}
	const most = 1 << 24 // what the side-car carries (sync.AdaptiveConfig refuses more)
	for _, v := range []C.int64_t{initBatch, maxBatch, minLocal, maxLocal} {
		if v < 0 || v > most {
			return status(fmt.Errorf("%w: adaptive batch sizes must be in [0, %d], got %d", engine.ErrInvalid, most, v))
		}
	}
	cfg := gsync.DefaultAdaptiveConfig()
	cfg.InitBatch, cfg.MaxBatch, cfg.MinMicroBatch, cfg.MaxMicroBatch = int(initBatch), int(maxBatch), int(minLocal), int(maxLocal)
	cfg.LRRule, cfg.NoAccumulation = r, accumulation == 0
	return status(e.StartAdaptive(cfg))
}

//export gorovodGoAdaptivePlan
func gorovodGoAdaptivePlan(out *C.gorovod_adaptive_plan_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if out == nil {
		return status(fmt.Errorf("%w: gorovod_adaptive_plan(NULL)", engine.ErrInvalid))
	}
	p, err := e.AdaptivePlan()
	if err != nil {
		return status(err)
	}
	out.global_batch, out.micro_batch, out.accum_steps = C.int64_t(p.Global), C.int64_t(p.MicroBatch), C.int64_t(p.Accum)
	out.lr_factor = C.double(p.LRFactor)
	return statusOK
}

//export gorovodGoAdaptiveSetGlobalBatch
func gorovodGoAdaptiveSetGlobalBatch(n C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if n < 1 || n > 1<<40 {
		return status(fmt.Errorf("%w: gorovod_adaptive_set_global_batch(%d)", engine.ErrInvalid, n))
	}
	return status(e.SetGlobalBatch(int(n)))
}

//export gorovodGoAdaptiveRecordMicroBatch
func gorovodGoAdaptiveRecordMicroBatch(sq C.double) (rc C.int) {
	defer guard(&rc)
	e, err := current()
	if err != nil {
		return status(err)
	}
	if !(sq >= 0) || math.IsInf(float64(sq), 0) {
		return status(fmt.Errorf("%w: gorovod_adaptive_record_micro_batch(%v): not a finite squared norm", engine.ErrInvalid, float64(sq)))
	}
	return status(e.RecordMicroBatchNorm(float64(sq)))
}
