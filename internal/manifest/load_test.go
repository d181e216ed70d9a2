package manifest_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/manifest"
)

func TestEmbeddedLoads(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	refund, ok := s.ByCode("ticket.refund")
	if !ok {
		t.Fatal("ticket.refund missing")
	}
	if c, ok := s.ByMethod("/examples.helpdesk.v1.HelpdeskService/IssueRefund"); !ok || c != refund {
		t.Fatal("ByMethod does not find IssueRefund")
	}
	md, ok := s.Method("ticket.refund")
	if !ok || md.Input().FullName() != "examples.helpdesk.v1.IssueRefundRequest" {
		t.Fatalf("Method(ticket.refund) = %v", md)
	}
	if !bytes.Equal(s.Bytes(), genmanifest.Manifest) {
		t.Fatal("Bytes() is not the verbatim manifest")
	}
	if _, err := s.Types().FindMessageByName("examples.helpdesk.v1.Money"); err != nil {
		t.Fatalf("dynamic types: %v", err)
	}
}

func TestLoadRefuses(t *testing.T) {
	m, d := genmanifest.Manifest, genmanifest.DescriptorSet
	otherDescriptors := append(append([]byte{}, d...), 0x0a, 0x00) // one more empty file entry
	cases := []struct {
		name     string
		manifest []byte
		desc     []byte
		want     string
	}{
		{"edited content", bytes.Replace(m, []byte(`"risk": "L3"`), []byte(`"risk": "L1"`), 1), d, "does not match content"},
		{"truncated", m[:len(m)/2], d, "decode"},
		{"not JSON", []byte("risk: L3"), d, "decode"},
		{"unknown field", bytes.Replace(m, []byte(`"descriptor_set_digest":`), []byte(`"extra": 1, "descriptor_set_digest":`), 1), d, "unknown field"},
		{"wrong format", bytes.Replace(m, []byte(manifest.Format), []byte("mandate.manifest/v0"), 1), d, "format"},
		{"descriptors of another build", m, otherDescriptors, "different builds"},
		{"empty descriptors", m, nil, "different builds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := manifest.Load(tc.manifest, tc.desc)
			if !errors.Is(err, manifest.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load() error = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestEncodeIsCanonical(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	again, err := manifest.Encode(s.Manifest())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, genmanifest.Manifest) {
		t.Fatal("re-encoding the loaded manifest changes its bytes")
	}
}
