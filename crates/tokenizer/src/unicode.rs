//! Code-point classes as llama.cpp's `unicode.cpp` sees them, and GPT-2's byte↔char map.
//!
//! Each code point gets one class byte (letter, number, punctuation, mark, symbol, other, plus a
//! whitespace bit). ASCII is a 128-entry table; other code points go through a binary search of
//! the Unicode general-category table, so classification costs O(log n) only off ASCII.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// `\p{L}`
pub const LETTER: u8 = 1;
/// `\p{N}`
pub const NUMBER: u8 = 2;
/// `\p{P}`
pub const PUNCT: u8 = 4;
/// `\p{M}`
pub const ACCENT: u8 = 8;
/// `\p{S}`
pub const SYMBOL: u8 = 16;
/// Control, format, separator, unassigned: none of the above.
pub const OTHER: u8 = 32;
/// Unicode `White_Space` (llama.cpp's `unicode_set_whitespace`); combined with a category bit.
pub const WS: u8 = 64;

const fn ascii_class(c: u8) -> u8 {
    match c {
        b'\t' | b'\n' | 0x0B | 0x0C | b'\r' => OTHER | WS,
        b' ' => OTHER | WS,
        b'0'..=b'9' => NUMBER,
        b'A'..=b'Z' | b'a'..=b'z' => LETTER,
        b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~' => SYMBOL,
        0x21..=0x7E => PUNCT,
        _ => OTHER,
    }
}

static ASCII: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = ascii_class(i as u8);
        i += 1;
    }
    t
};

fn is_whitespace(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000
    )
}

/// The class byte of one code point.
#[inline]
pub fn class_of(c: char) -> u8 {
    let cp = c as u32;
    if cp < 128 {
        return ASCII[cp as usize];
    }
    let cat = match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => LETTER,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => ACCENT,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => NUMBER,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::OpenPunctuation
        | G::ClosePunctuation
        | G::InitialPunctuation
        | G::FinalPunctuation
        | G::OtherPunctuation => PUNCT,
        G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => SYMBOL,
        _ => OTHER,
    };
    if is_whitespace(cp) {
        cat | WS
    } else {
        cat
    }
}

/// The byte llama.cpp substitutes for a code point in its "collapsed" text, on which
/// `\p{..}` regexes run as plain byte regexes (ASCII stays itself).
#[inline]
pub fn collapsed_byte(c: char, class: u8) -> u8 {
    let cp = c as u32;
    if cp < 128 {
        return cp as u8;
    }
    if class & WS != 0 {
        return 0x0B;
    }
    match class {
        NUMBER => 0xD1,
        LETTER => 0xD2,
        PUNCT => 0xD3,
        ACCENT => 0xD4,
        SYMBOL => 0xD5,
        _ => 0xD0,
    }
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`): visible Latin-1 bytes map to
/// themselves, the other 68 to U+0100.. in byte order.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let visible =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if visible {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(256 + n).unwrap_or('\0');
            n += 1;
            c
        };
    }
    table
}

/// Lowercase for the ASCII letters the contraction rules test (`'S`, `'LL`, ...).
#[inline]
pub fn ascii_lower(cp: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cp) {
        cp + 32
    } else {
        cp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_onto_gpt2_chars() {
        let t = byte_to_char_table();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        let mut seen = std::collections::HashSet::new();
        assert!(t.iter().all(|c| seen.insert(*c)));
    }

    #[test]
    fn classes_follow_unicode_categories() {
        assert_eq!(class_of('a'), LETTER);
        assert_eq!(class_of('7'), NUMBER);
        assert_eq!(class_of('你'), LETTER);
        assert_eq!(class_of('①'), NUMBER);
        assert_eq!(class_of('\u{3000}'), OTHER | WS);
        assert_eq!(class_of('🙂'), SYMBOL);
        assert_eq!(class_of('\u{301}'), ACCENT);
        assert_eq!(class_of('\u{1c}'), OTHER);
    }
}
