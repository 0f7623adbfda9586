package appauth

import (
	"strings"
	"testing"
)

// TestParseToken: the token is the file trimmed; an empty file or one that
// a header could not carry unchanged is refused without quoting it.
func TestParseToken(t *testing.T) {
	tests := []struct {
		name, file, want, wantErr string
	}{
		{"trimmed", "  s3cr3t-T0ken_value.~+/=\n", "s3cr3t-T0ken_value.~+/=", ""},
		{"empty", " \n\t\n", "", "the file is empty"},
		{"two lines", "abc-secret\ndef-secret\n", "", "one line of printable ASCII without spaces"},
		{"space inside", "abc secret", "", "without spaces"},
		{"control", "abc\x01secret", "", "printable ASCII"},
		{"not ASCII", "abcé-secret", "", "printable ASCII"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseToken([]byte(tt.file))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("the error quotes the file: %v", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseToken = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
