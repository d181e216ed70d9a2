package failure

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The markers between which the README holds the table of codes.
const (
	ReadmeBegin = "<!-- codes:begin -->"
	ReadmeEnd   = "<!-- codes:end -->"
)

// Markdown renders the table of codes as the README shows it, one row per
// code in the table's order.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| code | stages | gRPC | HTTP | retriable | meaning | default remedy |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range Codes() {
		stages, grpc, httpStatus, retriable, remedy := "—", "—", "—", "no", "—"
		if len(s.Stages) > 0 {
			stages = "`" + strings.Join(s.Stages, "`, `") + "`"
		}
		if s.Answered() {
			grpc, httpStatus = s.GRPC.String(), strconv.Itoa(s.HTTP)
		}
		if s.Retriable {
			retriable = "yes"
		}
		if s.Remedy != "" {
			remedy = s.Remedy
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s |\n", s.Code, stages, grpc, httpStatus, retriable, s.Meaning, remedy)
	}
	return b.String()
}

// ReplaceTable returns readme with the text between ReadmeBegin and
// ReadmeEnd replaced by Markdown.
func ReplaceTable(readme []byte) ([]byte, error) {
	begin := bytes.Index(readme, []byte(ReadmeBegin))
	end := bytes.Index(readme, []byte(ReadmeEnd))
	if begin < 0 || end < begin {
		return nil, errors.New("the README has no " + ReadmeBegin + " … " + ReadmeEnd + " markers")
	}
	var out bytes.Buffer
	out.Write(readme[:begin+len(ReadmeBegin)])
	out.WriteString("\n")
	out.WriteString(Markdown())
	out.Write(readme[end:])
	return out.Bytes(), nil
}
