package failure_test

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
)

// stages are the pipeline stages of docs/architecture/pipeline.md, plus
// decode: the REST gateway's reading of a request before the pipeline.
var stages = []string{
	"decode", "authenticate", "request_check", "load_definition", "entitlement_check", "permission_check",
	"schema_validate", "scope_check", "idempotency_check", "sod_check", "condition_check", "budget_check", "confirmation_check", "audit", "dispatch",
}

var codeShape = regexp.MustCompile(`^[a-z]+\.[a-z_]+$`)

// TestTableRowsAreConsistent holds every row to the rules of the package
// doc: a code's HTTP status is its gRPC code's unless the gateway answers
// it, a code only recorded has neither, a code a client receives says what
// to do next, and a dependency that is unavailable is worth a retry.
func TestTableRowsAreConsistent(t *testing.T) {
	rows := failure.Codes()
	if len(rows) == 0 {
		t.Fatal("the table is empty")
	}
	for _, s := range rows {
		t.Run(s.Code, func(t *testing.T) {
			if !codeShape.MatchString(s.Code) {
				t.Errorf("code %q is not namespace.name in lower case", s.Code)
			}
			if s.Meaning == "" {
				t.Error("no meaning")
			}
			for _, st := range s.Stages {
				if !slices.Contains(stages, st) {
					t.Errorf("unknown stage %q", st)
				}
			}
			if got, ok := failure.Lookup(s.Code); !ok || got.Code != s.Code {
				t.Errorf("Lookup = %+v, %v", got, ok)
			}
			if !s.Answered() {
				if s.HTTP != 0 || s.Gateway || s.Retriable || s.Remedy != "" {
					t.Errorf("a code only recorded has an HTTP status, a gateway, a retry or a remedy: %+v", s)
				}
				if got := failure.GRPCCode(s.Code); got != failure.UnknownCode {
					t.Errorf("GRPCCode = %v, want %v for a code never answered", got, failure.UnknownCode)
				}
				return
			}
			if got := failure.GRPCCode(s.Code); got != s.GRPC {
				t.Errorf("GRPCCode = %v, want the table's %v", got, s.GRPC)
			}
			if s.Remedy == "" {
				t.Error("a code a client receives has no remedy")
			}
			if s.HTTP < 400 || s.HTTP > 599 {
				t.Errorf("HTTP %d is not an error status", s.HTTP)
			}
			if want := failure.HTTPStatus(s.GRPC); !s.Gateway && s.HTTP != want {
				t.Errorf("HTTP %d, but %v maps to %d", s.HTTP, s.GRPC, want)
			}
			if s.GRPC == codes.Unavailable && !s.Retriable {
				t.Error("an unavailable dependency is not retriable")
			}
			if s.Retriable && (s.GRPC == codes.InvalidArgument || s.GRPC == codes.PermissionDenied || s.GRPC == codes.Unauthenticated || s.GRPC == codes.NotFound) {
				t.Errorf("retriable with %v: the same call cannot succeed later", s.GRPC)
			}
			// The wire agrees with the table on both channels.
			st := status.Convert(failure.New("", s.Code, "m"))
			if st.Code() != s.GRPC {
				t.Errorf("status code %v, want %v", st.Code(), s.GRPC)
			}
			if p := failure.Problem(st, ""); !s.Gateway && (p.Status != s.HTTP || p.Code != s.Code) {
				t.Errorf("problem %+v, want status %d", p, s.HTTP)
			}
		})
	}
}

func TestLookupReturnsACopy(t *testing.T) {
	s, ok := failure.Lookup(failure.CodeCommandNotFound)
	if !ok || len(s.Stages) == 0 {
		t.Fatalf("Lookup = %+v, %v", s, ok)
	}
	s.Stages[0] = "changed"
	if again, _ := failure.Lookup(failure.CodeCommandNotFound); again.Stages[0] == "changed" {
		t.Fatal("Lookup shares the table's stages")
	}
}

// TestCodesOutsideTheTable: a backend's domain code is not Mandate's and
// gets no guess from its shape — it keeps the gRPC code the backend set, and
// without one it is UnknownCode. A stage name is not a code.
func TestCodesOutsideTheTable(t *testing.T) {
	for _, code := range []string{"refund.exceeds_paid", "state.ticket_closed", "state_check", "helpdesk.unavailable", "scope.other", ""} {
		if _, ok := failure.Lookup(code); ok {
			t.Fatalf("%q is in the table", code)
		}
		if got := failure.GRPCCode(code); got != failure.UnknownCode {
			t.Errorf("GRPCCode(%q) = %v, want %v", code, got, failure.UnknownCode)
		}
	}
	domain := failure.New("pre_invariant", "refund.exceeds_paid", "more than was paid")
	domain.Status = codes.FailedPrecondition
	st := status.Convert(domain)
	p := failure.Problem(st, "")
	if st.Code() != codes.FailedPrecondition || p.Status != http.StatusUnprocessableEntity || p.Code != "refund.exceeds_paid" || p.Stage != "pre_invariant" {
		t.Fatalf("domain refusal: status %v, problem %+v", st.Code(), p)
	}
	if c := status.Code(failure.New("pre_invariant", "refund.exceeds_paid", "m")); c != failure.UnknownCode {
		t.Fatalf("a domain code without Status is %v, want %v", c, failure.UnknownCode)
	}
}

func TestCarriesCodeAndFallbackCode(t *testing.T) {
	bare := status.New(codes.InvalidArgument, "bad")
	if failure.CarriesCode(bare) {
		t.Fatal("a bare status carries a code")
	}
	if p := failure.Problem(bare, ""); p.Code != failure.FallbackCode(codes.InvalidArgument) || p.Code != "grpc.invalidargument" {
		t.Fatalf("problem code %q", p.Code)
	}
	if !failure.CarriesCode(failure.ToStatus(failure.New("", failure.CodeSchemaInvalid, "m"))) {
		t.Fatal("a Mandate error's status carries no code")
	}
}

// TestReadmeTableIsGenerated keeps the README's table of codes equal to the
// table.
func TestReadmeTableIsGenerated(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := failure.ReplaceTable(readme)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(readme) {
		t.Fatal("the README's table of codes differs from internal/failure's table: run go generate ./internal/failure")
	}
}

func TestReplaceTable(t *testing.T) {
	got, err := failure.ReplaceTable([]byte("a\n" + failure.ReadmeBegin + "\nstale\n" + failure.ReadmeEnd + "\nb\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\n" + failure.ReadmeBegin + "\n" + failure.Markdown() + failure.ReadmeEnd + "\nb\n"; string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := failure.ReplaceTable([]byte("no markers")); err == nil {
		t.Fatal("a README without markers is accepted")
	}
}
