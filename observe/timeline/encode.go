package timeline

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// appendEvent writes ev as one Trace Event Format object.
func appendEvent(b []byte, ev *event, pid int) []byte {
	b = append(b, `{"name":`...)
	switch ev.kind {
	case evCollective:
		b = appendString(b, ev.op.Collective)
	case evPhase:
		b = appendString(b, ev.phase.Phase.String())
	default:
		b = appendString(b, ev.name)
	}
	if ev.cat != "" {
		b = append(b, `,"cat":`...)
		b = appendString(b, ev.cat)
	}
	b = append(b, `,"ph":"`...)
	b = append(b, ev.ph, '"')
	if ev.ph != 'M' {
		b = append(b, `,"ts":`...)
		b = appendMicros(b, ev.ts)
	}
	if ev.ph == 'X' {
		b = append(b, `,"dur":`...)
		b = appendMicros(b, max(ev.dur, 0))
	}
	if ev.ph == 'i' {
		b = append(b, `,"s":"`...)
		b = append(b, ev.scope, '"')
	}
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(pid), 10)
	switch {
	case ev.ph == 'M' && ev.metaID != 0:
		b = append(b, `,"tid":`...)
		b = strconv.AppendInt(b, int64(ev.metaID), 10)
	case ev.ph != 'M' && ev.ph != 'C':
		b = append(b, `,"tid":`...)
		b = strconv.AppendInt(b, int64(ev.track), 10)
	}
	b = append(b, `,"args":{`...)
	n := 0
	switch ev.kind {
	case evCollective:
		b, n = appendOpArgs(b, &ev.op, n)
		if ev.err != nil {
			b, n = appendArg(b, Str("error", ev.err.Error()), n)
		}
	case evPhase:
		b, n = appendArg(b, Str("collective", ev.op.Collective), n)
		b, n = appendArg(b, Int("seq", int64(ev.op.Seq)), n)
		if ev.phase.Reduce > 0 {
			b, n = appendArg(b, Float("reduce_us", float64(ev.phase.Reduce.Nanoseconds())/1e3), n)
		}
	}
	for i := range int(ev.nargs) {
		b, n = appendArg(b, ev.args[i], n)
	}
	return append(b, "}}"...)
}

func appendOpArgs(b []byte, op *collectiveOp, n int) ([]byte, int) {
	b, n = appendArg(b, Int("seq", int64(op.Seq)), n)
	b, n = appendArg(b, Str("algorithm", op.Algorithm), n)
	if op.DType != 0 {
		b, n = appendArg(b, Str("dtype", op.DType.String()), n)
	}
	if op.Op != 0 {
		b, n = appendArg(b, Str("op", op.Op.String()), n)
	}
	b, n = appendArg(b, Int("bytes", op.Bytes), n)
	b, n = appendArg(b, Int("count", int64(op.Count)), n)
	if op.Collective == "broadcast" {
		b, n = appendArg(b, Int("root", int64(op.Root)), n)
	}
	b, n = appendArg(b, Int("epoch", int64(op.Epoch)), n)
	b, n = appendArg(b, Int("rank", int64(op.Rank)), n)
	b, n = appendArg(b, Int("size", int64(op.Size)), n)
	return b, n
}

func appendArg(b []byte, a Arg, n int) ([]byte, int) {
	if n > 0 {
		b = append(b, ',')
	}
	b = appendString(b, a.key)
	b = append(b, ':')
	switch a.kind {
	case argInt:
		b = strconv.AppendInt(b, int64(a.num), 10)
	case argStr:
		b = appendString(b, a.str)
	case argFloat:
		f := math.Float64frombits(a.num)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			b = append(b, "null"...)
		} else {
			b = strconv.AppendFloat(b, f, 'g', -1, 64)
		}
	default:
		b = append(b, "null"...)
	}
	return b, n + 1
}

// appendMicros writes nanoseconds as microseconds with three decimals, the
// unit of the format's "ts" and "dur".
func appendMicros(b []byte, ns int64) []byte {
	if ns < 0 {
		b = append(b, '-')
		ns = -ns
	}
	b = strconv.AppendInt(b, ns/1000, 10)
	frac := ns % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	if plain(s) {
		b = append(b, s...)
		return append(b, '"')
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\t':
				b = append(b, '\\', 't')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// plain says whether s is printable ASCII without quotes or backslashes:
// the names and keys of nearly every event, written as they are.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
