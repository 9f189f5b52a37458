// Prints llama.cpp's pre-tokenizer words (its GPT-4o regex) for each record of stdin (records end
// with \x1e), one JSON array of words per line. The regex is llama-vocab.cpp's for
// LLAMA_VOCAB_PRE_TYPE_GPT4O (its std::regex form, not the commented original), copied verbatim.
#include "unicode.h"
#include <iostream>
#include <string>
#include <vector>
int main() {
    const std::vector<std::string> exprs = {
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    };
    std::string line;
    while (std::getline(std::cin, line, '\x1e')) {
        auto words = unicode_regex_split(line, exprs, false);
        std::cout << "[";
        for (size_t i = 0; i < words.size(); ++i) {
            std::cout << (i ? "," : "") << "\"";
            for (char c : words[i]) { if (c == '"' || c == '\\') std::cout << '\\'; if (c == '\n') { std::cout << "\\n"; continue; } if (c == '\r') { std::cout << "\\r"; continue; } if (c == '\t') { std::cout << "\\t"; continue; } std::cout << c; }
            std::cout << "\"";
        }
        std::cout << "]\n";
    }
}
