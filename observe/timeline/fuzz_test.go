package timeline

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzReadEvents: whatever a trace file holds, ReadEvents returns only JSON
// objects, and Merge writes a valid JSON array of them.
func FuzzReadEvents(f *testing.F) {
	f.Add([]byte(`[{"name":"a","ph":"X","ts":1,"dur":2,"pid":1,"tid":1,"args":{}}`))
	f.Add([]byte(`{"traceEvents":[{"name":"a"}],"displayTimeUnit":"ms"}`))
	f.Add([]byte("[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"x\"}},\n{\"name\":\"cut"))
	f.Fuzz(func(t *testing.T, data []byte) {
		evs, _ := ReadEvents(bytes.NewReader(data))
		for _, ev := range evs {
			var m map[string]any
			if err := json.Unmarshal(ev, &m); err != nil {
				t.Fatalf("event %q is not a JSON object: %v", ev, err)
			}
		}
		var out bytes.Buffer
		n, _ := Merge(&out, bytes.NewReader(data))
		var all []json.RawMessage
		if err := json.Unmarshal(out.Bytes(), &all); err != nil || len(all) != n || n != len(evs) {
			t.Fatalf("merged output (%d events, read %d) is not a JSON array of them: %v\n%s", n, len(evs), err, out.Bytes())
		}
	})
}

// FuzzAppendString: every string is written as a JSON string that decodes
// to it (invalid UTF-8 to U+FFFD, as encoding/json does).
func FuzzAppendString(f *testing.F) {
	f.Add("plain")
	f.Add("quote \" backslash \\ control \x00\x1f del \x7f")
	f.Add("bad \xff utf8 \xe2\x82 and ünïcode ✓")
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q encoded as %s: %v", s, b, err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		if !utf8.ValidString(s) {
			// encoding/json replaces each invalid byte; so do we.
			var sb strings.Builder
			for i := 0; i < len(s); {
				r, size := utf8.DecodeRuneInString(s[i:])
				sb.WriteRune(r)
				i += size
			}
			want = sb.String()
		}
		if got != want {
			t.Fatalf("%q came back as %q, want %q", s, got, want)
		}
	})
}
