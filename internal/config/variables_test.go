package config

import (
	"bytes"
	"slices"
	"testing"
)

func TestUnknownVariables(t *testing.T) {
	environ := []string{
		"PATH=/bin",
		"MANDATE_DATABASE_URL=postgres://secret@db", // known
		"MANDATE_TEST_DATABASE_URL=x",               // known, read by the tests
		"MANDATE_MANIFST=m.json",                    // misspelt
		"MANDATE_SERVICE_SECRT=s3cret",              // misspelt, a secret
		"MANDATE_NOTHING_LIKE_ANYTHING=1",           // nothing close
		"MANDATE_MANIFST=again",                     // reported once
	}
	got := UnknownVariables(environ)
	want := []Unknown{
		{Name: "MANDATE_MANIFST", Nearest: "MANDATE_MANIFEST"},
		{Name: "MANDATE_NOTHING_LIKE_ANYTHING"},
		{Name: "MANDATE_SERVICE_SECRT", Nearest: "MANDATE_SERVICE_SECRET"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("UnknownVariables = %+v, want %+v", got, want)
	}
	var b bytes.Buffer
	WarnUnknown(&b, environ)
	wantOut := "mandate: warning: MANDATE_MANIFST is not a Mandate setting and is ignored; did you mean MANDATE_MANIFEST?\n" +
		"mandate: warning: MANDATE_NOTHING_LIKE_ANYTHING is not a Mandate setting and is ignored\n" +
		"mandate: warning: MANDATE_SERVICE_SECRT is not a Mandate setting and is ignored; did you mean MANDATE_SERVICE_SECRET?\n"
	if b.String() != wantOut {
		t.Fatalf("WarnUnknown wrote\n%s\nwant\n%s", b.String(), wantOut)
	}
	if bytes.Contains(b.Bytes(), []byte("s3cret")) || bytes.Contains(b.Bytes(), []byte("m.json")) {
		t.Fatal("a warning shows a variable's value")
	}
	var none bytes.Buffer
	WarnUnknown(&none, []string{"MANDATE_STORE=memory", "HOME=/root"})
	if none.Len() != 0 {
		t.Fatalf("warned about known variables: %q", none.String())
	}
}

func TestDeclaredRecordsEveryFlag(t *testing.T) {
	s := New("x", nil)
	var v string
	s.String(&v, "some-setting-for-the-test", "", "")
	if !slices.Contains(Declared(), "MANDATE_SOME_SETTING_FOR_THE_TEST") {
		t.Fatalf("Declared() = %v", Declared())
	}
}
